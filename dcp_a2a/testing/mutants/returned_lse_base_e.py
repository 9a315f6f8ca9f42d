"""Base confusion: the merge itself honours is_lse_base_on_e=False, but the merged LSE is returned in natural-log units, so a cascade merge downstream (base 2, as FlashInfer MLA emits) mixes bases."""

import math

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def merge_weights(self, lses, is_lse_base_on_e):
        w, g = super().merge_weights(lses, is_lse_base_on_e)
        return w, (g if is_lse_base_on_e else g * math.log(2))


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
