"""Precision: the merged output is cast to its dtype by truncation (round toward zero) instead of round-to-nearest-even, up to 1 ulp and biased."""

import torch

from dcp_a2a.reference.contract import ReferenceContract

_INT = {2: torch.int16, 4: torch.int32}


class Mutant(ReferenceContract):
    def round_output(self, y, dtype):
        r = y.to(dtype)
        bits = r.view(_INT[r.element_size()]).clone()
        # nearest rounding went away from zero: step the magnitude back by one ulp
        away = (r.to(torch.float64).abs() > y.abs()) & torch.isfinite(y)
        bits -= away.to(bits.dtype)
        return bits.view(dtype)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
