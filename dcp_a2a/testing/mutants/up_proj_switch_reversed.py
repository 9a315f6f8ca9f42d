"""Up-projection switch the wrong way round: projects before the exchange below the switch point and merges the latent first from it on (the comparison reversed), so the larger batches move L lanes a head instead of V and read only their own W."""

import dcp_a2a
from dcp_a2a.up_projection import switch_point

lse_pack_dim, pack_send, unpack_combine = (dcp_a2a.lse_pack_dim, dcp_a2a.pack_send,
                                           dcp_a2a.unpack_combine)


def lse_reduce(out, lse, group, *, return_lse=False, is_lse_base_on_e=True, seq_lens=None,
               query_start_loc=None, into=None, w_uv=None):
    kw = dict(return_lse=return_lse, is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
              query_start_loc=query_start_loc, into=into, w_uv=w_uv)
    if w_uv is None or not hasattr(w_uv, "shape") or w_uv.dim() != 3:
        return dcp_a2a.lse_reduce(out, lse, group, **kw)
    B, H, L = out.shape
    at = switch_point(out.device, group.world_size, H, L, w_uv.shape[2], out.dtype)
    first = at is not None and B < at  # the bug: should be B >= at
    return dcp_a2a.lse_reduce(out, lse, group,
                              up_proj="before_exchange" if first else "after_merge", **kw)
