"""Up-projection by the wrong heads' W_UV: every rank merges the latent and projects its merged heads by the first H/N heads' W (the rank's offset into W_UV forgotten), so every rank but rank 0 returns another head's projection."""

import torch

import dcp_a2a
from dcp_a2a.kernels.project import project

lse_pack_dim, pack_send, unpack_combine = (dcp_a2a.lse_pack_dim, dcp_a2a.pack_send,
                                           dcp_a2a.unpack_combine)


def lse_reduce(out, lse, group, *, return_lse=False, is_lse_base_on_e=True, seq_lens=None,
               query_start_loc=None, into=None, w_uv=None):
    kw = dict(return_lse=return_lse, is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
              query_start_loc=query_start_loc)
    if w_uv is None:
        return dcp_a2a.lse_reduce(out, lse, group, into=into, **kw)
    # the checks of the real call (shapes, dtypes, into), then the bug
    dcp_a2a.wire.check_w_uv(w_uv, out.shape[1], out.shape[2], out.dtype, out.device)
    res = dcp_a2a.lse_reduce(out, lse, group, **kw)
    latent, merged_lse = res if return_lse else (res, None)
    hpr = latent.shape[1]
    y = into if into is not None else torch.empty((*latent.shape[:2], w_uv.shape[2]),
                                                  dtype=out.dtype, device=out.device)
    project(latent, w_uv[:hpr], y)  # should be w_uv[rank * hpr:(rank + 1) * hpr]
    return (y, merged_lse) if return_lse else y
