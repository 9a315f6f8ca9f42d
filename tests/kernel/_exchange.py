"""Any implementation's pack_send run on every rank, exchanged in process (an all-to-all is a
transpose of the send buffers), then unpack_combine on every rank. Contract functions only."""

from __future__ import annotations

import torch

from tests._data import poison_like


def pack_all(impl, outs, lses, *, seq_lens=None, query_start_loc=None):
    """Send buffers of every rank, each poisoned before the kernel writes it."""
    n, b, h, d = outs.shape
    p = impl.lse_pack_dim(outs.dtype)
    sends = []
    for r in range(n):
        send = poison_like(torch.empty((n, b, h // n, d + p), dtype=outs.dtype,
                                       device=outs.device))
        impl.pack_send(outs[r], lses[r], send, n, h // n, d, p,
                       seq_lens=None if seq_lens is None else seq_lens[r],
                       query_start_loc=query_start_loc)
        sends.append(send)
    return sends


def exchange(sends):
    """recv[r][src] = sends[src][r]."""
    stacked = torch.stack(sends)
    return [stacked[:, r].contiguous() for r in range(len(sends))]


def merge_all(impl, outs, lses, *, return_lse, base_e, ranks=None, **mask):
    """Every rank's (or only ``ranks``') unpack_combine result; None for the others."""
    d = outs.shape[-1]
    p = impl.lse_pack_dim(outs.dtype)
    recvs = exchange(pack_all(impl, outs, lses, **mask))
    return [impl.unpack_combine(recv, d, p, return_lse, base_e)
            if ranks is None or r in ranks else None for r, recv in enumerate(recvs)]
