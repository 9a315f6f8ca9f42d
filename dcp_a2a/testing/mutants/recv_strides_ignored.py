"""Strides: a strided recv (a slice of a larger buffer) is read as if its rows were packed, so the combine walks past the slice into the rows after it."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def _combine(self, recv, head_dim, return_lse, is_lse_base_on_e):
        if not recv.is_contiguous():
            packed = torch.empty(recv.shape, device="meta").stride()
            recv = torch.as_strided(recv, recv.shape, packed, recv.storage_offset())
        return super()._combine(recv, head_dim, return_lse, is_lse_base_on_e)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
