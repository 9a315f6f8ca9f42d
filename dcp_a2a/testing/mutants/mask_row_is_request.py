"""Empty shards: the mask takes row i for request i (one query token per request), ignoring query_start_loc, so with several tokens per request (speculative decode, chunked prefill) the wrong rows are masked and garbage partials merge in."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def empty_rows(self, num_rows, seq_lens, query_start_loc, device):
        empty = torch.zeros(num_rows, dtype=torch.bool, device=device)
        if seq_lens is not None:
            k = min(num_rows, seq_lens.numel())
            empty[:k] = seq_lens[:k] == 0
        return empty


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
