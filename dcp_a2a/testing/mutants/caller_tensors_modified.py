"""Side effect: the pack masks in place, writing -inf and 0 into the caller's lse and out for the rows it masks, tensors the engine still owns (and may read again, e.g. for a cascade merge)."""

import math

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def _pack(self, out, lse, send, world_size, hpr, D, seq_lens, query_start_loc):
        empty = self.empty_rows(out.shape[0], seq_lens, query_start_loc, out.device)
        lse.masked_fill_(empty[:, None], -math.inf)
        out.masked_fill_(empty[:, None, None], 0)
        super()._pack(out, lse, send, world_size, hpr, D, seq_lens, query_start_loc)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
