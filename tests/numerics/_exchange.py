"""The N-rank exchange in one process through the contract functions only.

Every rank packs its partial with ``impl.pack_send`` into a NaN-poisoned send buffer; the
all-to-all is a transpose of the stacked send buffers (``recv_r[src] = send_src[r]``); each
destination rank merges its heads with ``impl.unpack_combine``. This works for ANY
implementation of the contract, which is why the numerics tier uses it instead of the project's
in-process driver.
"""

from __future__ import annotations

import torch

from tests.kernel._exchange import pack_all


def _send_buffers(impl, outs, lses):
    return torch.stack(pack_all(impl, outs, lses))  # [src, dst, B, H/N, D+P]


def merge_rank(impl, outs, lses, rank, *, is_lse_base_on_e=True, return_lse=True):
    """Rank ``rank``'s merged ``out[B, H/N, D]`` (and float32 ``lse[B, H/N]``) for the
    per-rank partials ``outs[N, B, H, D]``, ``lses[N, B, H]``; also the head slice it owns."""
    n, _, h, d = outs.shape
    stacked = _send_buffers(impl, outs, lses)
    p = impl.lse_pack_dim(outs.dtype)
    res = impl.unpack_combine(stacked[:, rank].contiguous(), d, p, return_lse, is_lse_base_on_e)
    hpr = h // n
    heads = slice(rank * hpr, (rank + 1) * hpr)
    return (res if return_lse else (res, None)), heads


def merge(impl, outs, lses, *, is_lse_base_on_e=True, return_lse=True):
    """The full merged ``out[B, H, D]`` (every rank's heads, in rank order) and float32
    ``lse[B, H]`` (None without ``return_lse``)."""
    n, _, _, d = outs.shape
    stacked = _send_buffers(impl, outs, lses)
    p = impl.lse_pack_dim(outs.dtype)
    got = [impl.unpack_combine(stacked[:, r].contiguous(), d, p, return_lse, is_lse_base_on_e)
           for r in range(n)]
    if return_lse:
        return torch.cat([o for o, _ in got], dim=1), torch.cat([g for _, g in got], dim=1)
    return torch.cat(got, dim=1), None


class Exchange:
    """``merge`` / ``merge_rank`` bound to an implementation and a device; CPU in, CPU out."""

    def __init__(self, impl, device="cpu"):
        self.impl, self.device = impl, device

    def _to(self, outs, lses):
        return outs.to(self.device), lses.to(self.device)

    def merge(self, outs, lses, **kw):
        out, lse = merge(self.impl, *self._to(outs, lses), **kw)
        return out.cpu(), None if lse is None else lse.cpu()

    def merge_rank(self, outs, lses, rank, **kw):
        (out, lse), heads = merge_rank(self.impl, *self._to(outs, lses), rank, **kw)
        return (out.cpu(), None if lse is None else lse.cpu()), heads
