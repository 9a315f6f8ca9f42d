"""The N-rank exchange in one process through the contract functions only, for ANY
implementation: every rank packs its partial with ``impl.pack_send`` into a poisoned send buffer,
the all-to-all is :func:`dcp_a2a.inprocess.all_to_all` (``recv_r[src] = send_src[r]``), and
each destination rank merges its heads with ``impl.unpack_combine``. An implementation without
the packed wire (only the merge surface: ``merge``) merges each rank's heads of the N partials
directly.

    outs[N, B, H, D]  every rank's partial, in the output dtype
    lses[N, B, H]     every rank's LSE (float32, bfloat16 or float16)
"""

from __future__ import annotations

import torch

from ..inprocess import all_to_all
from .data import assert_unmodified, heads_of, poison_like, snapshot


def pack_all(impl, outs, lses, *, seq_lens=None, query_start_loc=None):
    """Send buffers ``[N, B, H/N, D+P]`` of every rank, each poisoned before the kernel writes
    it. ``seq_lens`` is None or one tensor per rank. Every tensor a rank hands to pack_send
    (out, lse, seq_lens, query_start_loc: the engine still owns them) must come back unchanged."""
    n, b, h, d = outs.shape
    p = impl.lse_pack_dim(outs.dtype)
    sends = []
    for r in range(n):
        send = poison_like(torch.empty((n, b, h // n, d + p), dtype=outs.dtype,
                                       device=outs.device))
        args = dict(out=outs[r], lse=lses[r],
                    seq_lens=None if seq_lens is None else seq_lens[r],
                    query_start_loc=query_start_loc)
        before = snapshot(**args)
        impl.pack_send(args.pop("out"), args.pop("lse"), send, n, h // n, d, p, **args)
        assert_unmodified(before, f"rank {r}'s pack_send")
        sends.append(send)
    return sends


def exchange(sends):
    """Every rank's receive buffer (fresh, contiguous): ``recv[r][src] = sends[src][r]``."""
    return all_to_all(sends)


def _has(impl, name: str) -> bool:
    """Whether ``impl`` (an Implementation, or any object with the contract's functions)
    has the function ``name``."""
    has = getattr(impl, "has", None)
    return has(name) if callable(has) else callable(getattr(impl, name, None))


def packed(impl) -> bool:
    """Whether the implementation merges through the packed wire (pack_send, unpack_combine)."""
    return all(_has(impl, n) for n in ("lse_pack_dim", "pack_send", "unpack_combine"))


def merge_heads(impl, outs, lses, rank, *, return_lse, base_e):
    """``rank``'s heads of the N partials merged by ``impl.merge`` (the merge surface without a
    wire): ``out[B, H/N, D]`` (and the float32 ``lse[B, H/N]`` with ``return_lse``)."""
    n, _, h, _ = outs.shape
    heads = heads_of(rank, n, h)
    o, l_ = outs[:, :, heads].contiguous(), lses[:, :, heads].contiguous()
    before = snapshot(outs=o, lses=l_)
    got = impl.merge(o, l_, is_lse_base_on_e=base_e, return_lse=return_lse)
    assert_unmodified(before, f"rank {rank}'s merge")
    return _pair(got, return_lse)


def merge_all(impl, outs, lses, *, return_lse, base_e, ranks=None, **mask):
    """Every rank's (or only ``ranks``') merged heads: unpack_combine of what every rank's
    pack_send sent it, or (an implementation without the wire) its merge; None for the
    others. Masks need the wire (the merge surface takes none)."""
    if not packed(impl) and _has(impl, "merge"):
        if any(v is not None for v in mask.values()):
            impl.pack_send  # the masks go through pack_send: MissingFunction names it
        return [merge_heads(impl, outs, lses, r, return_lse=return_lse, base_e=base_e)
                if ranks is None or r in ranks else None for r in range(outs.shape[0])]
    d = outs.shape[-1]
    p = impl.lse_pack_dim(outs.dtype)
    recvs = exchange(pack_all(impl, outs, lses, **mask))
    return [impl.unpack_combine(recv, d, p, return_lse, base_e)
            if ranks is None or r in ranks else None for r, recv in enumerate(recvs)]


def _pair(res, return_lse):
    """A ``merge``'s result as the contract's: the tensor alone without ``return_lse`` (a merge
    may return ``(out, None)`` then, as SGLang's combine does)."""
    if return_lse:
        return res
    return res[0] if isinstance(res, (tuple, list)) else res


def merge(impl, outs, lses, *, is_lse_base_on_e=True, return_lse=True):
    """The full merged ``out[B, H, D]`` (every rank's heads, in rank order) and float32
    ``lse[B, H]`` (None without ``return_lse``)."""
    got = merge_all(impl, outs, lses, return_lse=return_lse, base_e=is_lse_base_on_e)
    if return_lse:
        return torch.cat([o for o, _ in got], dim=1), torch.cat([g for _, g in got], dim=1)
    return torch.cat(got, dim=1), None


def merge_rank(impl, outs, lses, rank, *, is_lse_base_on_e=True, return_lse=True):
    """Rank ``rank``'s merged ``(out[B, H/N, D], lse[B, H/N] or None)`` and the heads it owns."""
    n, _, h, _ = outs.shape
    res = merge_all(impl, outs, lses, return_lse=return_lse, base_e=is_lse_base_on_e,
                    ranks={rank})[rank]
    return (res if return_lse else (res, None)), heads_of(rank, n, h)


class Exchange:
    """``merge`` / ``merge_rank`` bound to an implementation and a device; CPU in, CPU out.

    Inside the implementation's envelope: without a base asked for, the envelope's base; a base
    asked for that the envelope excludes skips the test ("outside the envelope"); a head dim
    outside it is padded with zero lanes to the envelope's next head dim and the result cut
    back (the merge is lane by lane: the lanes asked for are computed exactly as they would be,
    so a limit on head dims never stops a precision test before what it checks)."""

    def __init__(self, impl, device="cpu"):
        self.impl, self.device = impl, device

    def _fit(self, outs, lses, kw):
        env = self.impl.envelope
        if kw.get("is_lse_base_on_e") is None:
            kw["is_lse_base_on_e"] = env.base_e
        else:
            env.require(base_e=kw["is_lse_base_on_e"])
        d = outs.shape[-1]
        fit = env.fit_head_dim(d)
        if fit != d:
            outs = torch.nn.functional.pad(outs, (0, fit - d))
        return outs.to(self.device), lses.to(self.device), d

    def merge(self, outs, lses, **kw):
        o, l_, d = self._fit(outs, lses, kw)
        out, lse = merge(self.impl, o, l_, **kw)
        return out[..., :d].cpu(), None if lse is None else lse.cpu()

    def merge_rank(self, outs, lses, rank, **kw):
        o, l_, d = self._fit(outs, lses, kw)
        (out, lse), heads = merge_rank(self.impl, o, l_, rank, **kw)
        return (out[..., :d].cpu(), None if lse is None else lse.cpu()), heads
