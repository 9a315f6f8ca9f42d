"""Wire format: on unpack the low 16-bit LSE lane is sign-extended before OR-ing in the high half, corrupting every LSE whose bit 15 is set."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def lanes_to_lse(self, lanes):
        if lanes.shape[-1] == 1:
            return super().lanes_to_lse(lanes)
        lo = lanes[..., 0].to(torch.int32)  # missing "& 0xFFFF": int16 -> int32 sign-extends
        hi = lanes[..., 1].to(torch.int32) << 16
        return (hi | lo).view(torch.float32)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
