"""Wire format: an LSE delivered in bf16/fp16 has its raw 16 bits reinterpreted as (the low half of) fp32 bits instead of being converted by value."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def lse_to_fp32(self, lse, out_dtype):
        if lse.element_size() == 2:
            raw = lse.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
            return raw.view(torch.float32)
        return lse.to(torch.float32)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
