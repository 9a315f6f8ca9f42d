"""Wire format: the fp32 LSE's two 16-bit halves written high-first, read back the same way (self-consistent, but no other engine can read it)."""

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def lse_to_lanes(self, lse32, dtype):
        lanes = super().lse_to_lanes(lse32, dtype)
        return lanes.flip(-1) if lanes.shape[-1] == 2 else lanes

    def lanes_to_lse(self, lanes):
        return super().lanes_to_lse(lanes.flip(-1) if lanes.shape[-1] == 2 else lanes)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
