"""Index tensors read as if contiguous: seq_lens and query_start_loc given as views with strides (a rank's column of a [requests, N] table of local KV lengths) are read entry after entry from their first element, so other ranks' lengths and stray words decide which rows are masked."""

from dcp_a2a.reference.contract import ReferenceContract


def _as_if_contiguous(t):
    return None if t is None else t.as_strided((t.numel(),), (1,), t.storage_offset())


class Mutant(ReferenceContract):
    def empty_rows(self, num_rows, seq_lens, query_start_loc, device):
        return super().empty_rows(num_rows, _as_if_contiguous(seq_lens),
                                  _as_if_contiguous(query_start_loc), device)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
