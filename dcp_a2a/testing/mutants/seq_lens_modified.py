"""Side effect: the pack turns the caller's seq_lens into its 0/1 row mask in place (saving an allocation), corrupting metadata the engine reads again in its next step."""

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def _pack(self, out, lse, send, world_size, hpr, D, seq_lens, query_start_loc):
        if seq_lens is not None:
            seq_lens.clamp_(max=1)  # same mask: a length is only compared with 0
        super()._pack(out, lse, send, world_size, hpr, D, seq_lens, query_start_loc)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
