"""Strides: the pack reads out and lse as if contiguous from their data pointers, so a head slice of a larger attention output, or a transposed LSE, packs the wrong elements."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


def _as_if_contiguous(t):
    return torch.as_strided(t, t.shape, torch.empty(t.shape, device="meta").stride(),
                            t.storage_offset())


class Mutant(ReferenceContract):
    def _pack(self, out, lse, send, world_size, hpr, D, seq_lens, query_start_loc):
        super()._pack(_as_if_contiguous(out), _as_if_contiguous(lse), send, world_size, hpr, D,
                      seq_lens, query_start_loc)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
