"""NaN handling: NaN and +inf LSEs are not treated as -inf, so one bad rank poisons the whole merged row."""

import math

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def merge_weights(self, lses, is_lse_base_on_e):
        s = lses.double()
        m = s.amax(dim=0)
        m_safe = torch.where(m == -math.inf, torch.zeros_like(m), m)
        e = torch.exp(s - m_safe) if is_lse_base_on_e else torch.exp2(s - m_safe)
        total = e.sum(dim=0)
        safe = torch.where(total > 0, total, torch.ones_like(total))
        w = torch.where(total > 0, e / safe, torch.zeros_like(e))
        log = torch.log if is_lse_base_on_e else torch.log2
        g = torch.where(total > 0, m_safe + log(safe), torch.full_like(m, -math.inf))
        return w, g


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
