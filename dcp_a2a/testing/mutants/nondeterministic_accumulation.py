"""Non-determinism: ranks are accumulated in fp32 in a varying order (as with atomics), so identical inputs give different bits from call to call."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def weighted_sum(self, w, data):
        x = data.to(torch.float32)
        w32 = w.to(torch.float32)
        acc = torch.zeros(x.shape[1:], dtype=torch.float32, device=x.device)
        for n in torch.randperm(x.shape[0]).tolist():
            term = w32[n][..., None] * x[n]
            acc += torch.where(w32[n][..., None] > 0, term, torch.zeros_like(term))
        return acc.double()


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
