"""Head-to-rank mapping: head h is sent to peer h % N (round-robin) instead of the contiguous block [r*H/N, (r+1)*H/N)."""

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def peer_major(self, x, world_size, h_per_rank):
        return x.unflatten(1, (h_per_rank, world_size)).movedim(2, 0)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
