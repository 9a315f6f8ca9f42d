"""Overflow: weights computed as exp(s_n) / sum exp(s_k) in fp32 without subtracting the row max, so LSE spreads beyond ~88 overflow to inf/NaN."""

import math

import torch

from dcp_a2a.reference.combine import sanitize_lse
from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def merge_weights(self, lses, is_lse_base_on_e):
        s = sanitize_lse(lses).to(torch.float32)
        e = torch.exp(s) if is_lse_base_on_e else torch.exp2(s)
        total = e.sum(dim=0)
        w = torch.where(total > 0, e / total, torch.zeros_like(e))
        log = torch.log if is_lse_base_on_e else torch.log2
        g = torch.where(total > 0, log(total), torch.full_like(total, -math.inf))
        return w.double(), g.double()


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
