"""Dtype of the result: a group of one passes its inputs straight through, LSE included, so an LSE handed over in bf16/fp16 comes back in 16 bits from a group of one and in float32 from a group of N (code captured at N=1 then breaks at N>1)."""

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        n, _ = self.check_group(group)
        if n == 1 and seq_lens is None and query_start_loc is None:
            self.check_out_lse(out, lse)
            return (out, lse) if return_lse else out
        return super().lse_reduce(out, lse, group, return_lse=return_lse,
                                  is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
                                  query_start_loc=query_start_loc)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
