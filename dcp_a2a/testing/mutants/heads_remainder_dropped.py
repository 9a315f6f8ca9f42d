"""Validation: H not divisible by N is not refused; the remainder heads are silently dropped (a truncation instead of a ValueError)."""

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def check_heads(self, num_heads, world_size):
        return num_heads // world_size

    def peer_major(self, x, world_size, h_per_rank):
        return super().peer_major(x[:, :world_size * h_per_rank], world_size, h_per_rank)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
