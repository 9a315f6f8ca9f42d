"""Precision: the merged LSE is returned through the output dtype (rounded to bf16/fp16, then widened to float32), breaking cascaded merges."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def unpack_combine(self, recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
        res = super().unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)
        if not return_lse:
            return res
        out, lse = res
        return out, lse.to(recv.dtype).to(torch.float32)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
