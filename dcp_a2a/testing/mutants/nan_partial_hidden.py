"""NaN handling: NaN partials are zeroed before the weighted sum, also where their weight is positive, so a rank's faulty attention output vanishes into a plausible merged value."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def weighted_sum(self, w, data):
        return super().weighted_sum(w, torch.nan_to_num(data.to(torch.float64), nan=0.0))


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
