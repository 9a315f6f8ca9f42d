"""Empty shards: requests with seq_len 0 are masked but padding rows at or beyond query_start_loc[-1] are not (an off-by-the-tail mask)."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def empty_rows(self, num_rows, seq_lens, query_start_loc, device):
        empty = torch.zeros(num_rows, dtype=torch.bool)
        if seq_lens is not None:
            qsl = query_start_loc.cpu().tolist()
            for s, n in enumerate(seq_lens.cpu().tolist()):
                if n <= 0:
                    empty[qsl[s]:qsl[s + 1]] = True
        return empty.to(device)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
