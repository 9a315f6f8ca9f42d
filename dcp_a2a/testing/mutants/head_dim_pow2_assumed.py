"""Head dim: the combine processes a power-of-two block of lanes (the largest <= D, unmasked), leaving the tail of D=80/96/576 heads at zero."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def weighted_sum(self, w, data):
        d = data.shape[-1]
        block = 1 << (d.bit_length() - 1)
        acc = torch.zeros(data.shape[1:], dtype=torch.float64, device=data.device)
        acc[..., :block] = super().weighted_sum(w, data[..., :block])
        return acc


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
