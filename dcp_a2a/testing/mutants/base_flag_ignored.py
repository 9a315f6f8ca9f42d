"""Base confusion: is_lse_base_on_e=False is ignored, base-2 LSEs from FlashInfer MLA are merged with exp/log."""

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def merge_weights(self, lses, is_lse_base_on_e):
        return super().merge_weights(lses, True)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
