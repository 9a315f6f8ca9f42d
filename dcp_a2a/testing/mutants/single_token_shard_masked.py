"""Masking off by one: a request whose local KV shard holds exactly one token is taken for empty (seq_len < 2, from a length counted before the current token), so its partial never reaches the merge."""

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def empty_rows(self, num_rows, seq_lens, query_start_loc, device):
        if seq_lens is None:
            return super().empty_rows(num_rows, seq_lens, query_start_loc, device)
        return super().empty_rows(num_rows, seq_lens - 1, query_start_loc, device)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
