"""An in-process N-rank exchange with the reference wire format: the all-to-all is a transpose
of the per-rank send buffers."""

from __future__ import annotations

from typing import Sequence

import torch

from .wire import lse_pack_dim, pack_send, unpack_combine


def simulate_lse_reduce(outs_per_rank: Sequence[torch.Tensor],
                        lses_per_rank: Sequence[torch.Tensor], return_lse: bool = False,
                        is_lse_base_on_e: bool = True, seq_lens_per_rank=None,
                        query_start_loc=None) -> list:
    """Every rank's merged result: rank r gets heads [r*H/N, (r+1)*H/N) of the merge.

    ``outs_per_rank[r]`` is rank r's ``[B, H, D]`` partial and ``lses_per_rank[r]`` its
    ``[B, H]`` LSE; ``seq_lens_per_rank[r]`` (optional) its local KV lengths.
    """
    n = len(outs_per_rank)
    B, H, D = outs_per_rank[0].shape
    p = lse_pack_dim(outs_per_rank[0].dtype)
    sends = []
    for r in range(n):
        send = torch.empty((n, B, H // n, D + p), dtype=outs_per_rank[r].dtype)
        pack_send(outs_per_rank[r], lses_per_rank[r], send, n, H // n, D, p,
                  seq_lens=None if seq_lens_per_rank is None else seq_lens_per_rank[r],
                  query_start_loc=query_start_loc)
        sends.append(send)
    stacked = torch.stack(sends)  # [src, dst, B, H/N, D+P]
    return [unpack_combine(stacked[:, r], D, p, return_lse, is_lse_base_on_e) for r in range(n)]
