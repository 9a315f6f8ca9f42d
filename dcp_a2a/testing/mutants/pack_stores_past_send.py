"""Overrun: the pack stores a power-of-two block of lanes per row without a mask, so the last row's tail lands past the end of the send buffer, in the workspace the engine carved it from (next to live data)."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def _pack(self, out, lse, send, world_size, hpr, D, seq_lens, query_start_loc):
        super()._pack(out, lse, send, world_size, hpr, D, seq_lens, query_start_loc)
        # every row's unmasked tail lands in the next row, which its own program then
        # rewrites; only the last row's tail survives, past the end of the buffer
        lanes = send.shape[-1]
        tail = (1 << (lanes - 1).bit_length()) - lanes
        end = send.storage_offset() + send.numel()
        room = send.untyped_storage().nbytes() // send.element_size() - end
        if send.numel() and min(tail, room) > 0:
            torch.as_strided(send, (min(tail, room),), (1,), end).zero_()


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
