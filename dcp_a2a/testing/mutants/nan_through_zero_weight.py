"""NaN handling: partials are summed as w * o without a guard, so a rank of weight 0 with a NaN/inf partial turns the merge into NaN (0 * NaN = NaN)."""

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def weighted_sum(self, w, data):
        return (w[..., None] * data.double()).sum(dim=0)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
