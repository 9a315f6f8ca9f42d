"""The public kernel entry points: check the arguments, then launch (the launchers in
:mod:`dcp_a2a.kernels` trust what they are given).

    pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None) -> None
    unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e, into=None)
        -> out[B, H/N, D]  or  (out, lse[B, H/N] float32)   (out is ``into`` when given)

Shapes, dtypes and the wire format ``[N, B, H/N, D+P]`` are described in :mod:`dcp_a2a.wire`.

Each op checks a problem once (an eager call's host time). A call's key is what
every argument check reads: each tensor's type, shape, strides, dtype and device and the other
arguments' types and values; with each tensor's address modulo 16 (what Triton's compiled
kernel was specialised on). The first call of a key runs every check, and, when they pass,
launches and keeps the launch (:class:`~dcp_a2a.kernels.launch.Site`); a later call of that key
runs only what depends on the addresses themselves (the staging buffer's overlap with its
inputs) and launches the kept Site with the new addresses. A key counts only while the launch
table and the interpreter switch are those it was made under and no override is set; nothing
is kept under an override. Code that swaps the ops' internals some other way (a test's
monkeypatch) calls :func:`forget_calls` around it. A caller's result buffer (``into``) is part of
the key (its shape, strides, dtype, device, alignment); its overlap with recv is checked on
every call.

Under ``torch.compile`` both ops trace as the custom ops of :mod:`dcp_a2a.custom_ops`.
"""

from __future__ import annotations

import torch

from . import _env
from . import custom_ops as _custom
from .kernels import combine as _combine
from .kernels import pack as _pack
from .kernels import tuning as _tuning
from .wire import (
    check_head_split,
    check_into,
    check_output_and_lse,
    check_seq_meta,
    check_seq_values,
    check_wire_buffer,
    lse_pack_dim as _lse_pack_dim,
    reach,
    require_bool,
    require_disjoint,
    require_int,
    require_runnable_device,
    require_same_device,
)


_Tensor = torch.Tensor
# what building or looking up a key raises for an argument that gets none: not a tensor,
# unhashable, no storage (lse_reduce keys its checks the same way)
LOOKUP_ERRORS = (AttributeError, TypeError, RuntimeError)
CALLS_MAX = 4096  # keys a table keeps (distinct problems); then it starts again
_TABLES: list = []  # every table of kept keys, ours and lse_reduce's (dcp_a2a.collective)


def kept_table() -> dict:
    """A new table of kept keys, emptied by :func:`forget_calls` with the ops' own."""
    table: dict = {}
    _TABLES.append(table)
    return table


_PACK_CALLS = kept_table()
_UNPACK_CALLS = kept_table()
# True only while torch.compile traces (dynamo folds the call to a constant): the ops then trace
# as the custom ops of dcp_a2a.custom_ops; eagerly it is one call of ~0.05 us
compiling = torch.compiler.is_dynamo_compiling


def forget_calls() -> None:
    """Drop every kept key: the next call of each problem is checked in full again."""
    for table in _TABLES:
        table.clear()


class _Kept:
    """What a checked key keeps: the table it was launched under, the launch (or None), and
    for the pack the byte reach of send, out and lse (0: the overlap test does not apply)."""

    __slots__ = ("active", "interpret", "site", "hpr", "send_bytes", "out_bytes", "lse_bytes",
                 "out_shape", "lse_shape", "dtype", "device", "aligns", "recv_bytes",
                 "into_bytes")

    def __init__(self, site):
        self.active, self.interpret, self.site = _tuning.ACTIVE, _env.INTERPRET, site

    def current(self) -> bool:
        return (self.active is _tuning.ACTIVE and self.interpret == _env.INTERPRET
                and not _tuning.OVERRIDES)


def keep(table: dict, key, value) -> None:
    """``table[key] = value`` in a table of kept keys, emptied first once it holds CALLS_MAX."""
    if len(table) >= CALLS_MAX:
        table.clear()
    table[key] = value


def _keep(calls: dict, key, kept: _Kept) -> None:
    if _tuning.OVERRIDES:
        # a launch an override chose (the bench's and probes' candidates) is never kept: once
        # the override is gone the key would look current and launch the candidate again
        return
    keep(calls, key, kept)


def index_key(t):
    """None, or what check_seq_meta reads of an index tensor ``t``, and its alignment."""
    if t is None:
        return None
    return (type(t), t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def _reach_bytes(t: torch.Tensor) -> int:
    """Bytes from ``t``'s address to one past the last it can touch (0 when empty, or meta:
    the overlap test then skips it, as require_disjoint does)."""
    return 0 if t.is_meta else reach(t) * t.element_size()


def pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None) -> None:
    """Write ``send[N, B, H/N, D+P]`` from ``out[B, H, D]`` and ``lse[B, H]``.

    ``out`` in fp16/bf16/fp32, any strides; ``lse`` in fp32/bf16/fp16 (converted to fp32, never
    rounded). ``seq_lens[num_seqs]`` (this rank's local KV length per request) and
    ``query_start_loc[num_seqs + 1]`` (cumulative query rows, non-decreasing) mask empty and
    padding rows: their LSE is sent as -inf. Raises ValueError/TypeError for any inconsistent
    argument, before the launch; CPU index tensors' values too (a negative KV length, a
    decreasing query_start_loc, rows past the batch). CUDA index tensors are not read on the
    host: any values have the meaning :func:`dcp_a2a.wire.check_seq_values` states.
    """
    if compiling():
        return _custom.pack_send(out, lse, send, world_size, h_per_rank, head_dim,
                                 lse_pack_dim, seq_lens, query_start_loc)
    kept = key = None
    if type(out) is _Tensor and type(lse) is _Tensor and type(send) is _Tensor:
        try:
            po, pl, ps = out.data_ptr(), lse.data_ptr(), send.data_ptr()
            key = (out.shape, out.stride(), out.dtype, out.device, po & 15,
                   lse.shape, lse.stride(), lse.dtype, lse.device, pl & 15,
                   send.shape, send.stride(), send.dtype, send.device, ps & 15,
                   type(world_size), world_size, type(h_per_rank), h_per_rank,
                   type(head_dim), head_dim, type(lse_pack_dim), lse_pack_dim,
                   index_key(seq_lens), index_key(query_start_loc))
            kept = _PACK_CALLS.get(key)
        except LOOKUP_ERRORS:
            key = None
    if kept is None or not kept.current():
        _pack_checked(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                      seq_lens, query_start_loc, key)
        return
    if seq_lens is not None and seq_lens.is_cpu:  # values on the host: checked every call
        check_seq_values(seq_lens, query_start_loc, out.shape[0])
    sb = kept.send_bytes
    if sb and ((ps < po + kept.out_bytes and po < ps + sb)
               or (ps < pl + kept.lse_bytes and pl < ps + sb)):
        require_disjoint("send", send, out=out, lse=lse)  # raises, naming the overlap
    site = kept.site
    if site is not None:
        if seq_lens is None:
            if site(po, pl, ps, po, po):
                return
        elif site(po, pl, ps, seq_lens.data_ptr(), query_start_loc.data_ptr()):
            return
    # kept without a Site (its first launch could not be bound: a hook, a stand-in): bind now
    bound = _pack.pack(out, lse, send, kept.hpr, seq_lens, query_start_loc,
                       with_site=site is None)
    if bound is not None:
        kept.site = bound


def _pack_checked(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                  seq_lens, query_start_loc, key) -> None:
    """pack_send's every check, then the launch; the key is kept once the checks pass."""
    B, H, D = check_output_and_lse(out, lse)
    hpr = check_head_split(H, world_size)  # world_size: an int >= 1, then the split
    require_int("h_per_rank", h_per_rank, 1 if H else 0)
    if h_per_rank != hpr:
        raise ValueError(f"h_per_rank={h_per_rank} but H/N = {H}/{world_size} = {hpr}")
    require_int("head_dim", head_dim, 1)
    if head_dim != D:
        raise ValueError(f"head_dim={head_dim} does not match out's last dim {D}")
    p = _lse_pack_dim(out.dtype)
    require_int("lse_pack_dim", lse_pack_dim, 1)
    if lse_pack_dim != p:
        raise ValueError(f"lse_pack_dim={lse_pack_dim} does not match {out.dtype} (expected {p})")
    check_wire_buffer("send", send, head_dim=D, lse_pack_dim_=p, dtype=out.dtype,
                      expected_shape=(world_size, B, hpr, D + p))
    if send.device != out.device:  # out and lse were compared above
        require_same_device(out=out, lse=lse, send=send)
    check_seq_meta(seq_lens, query_start_loc, B, out.device)
    if seq_lens is not None and seq_lens.is_cpu:
        check_seq_values(seq_lens, query_start_loc, B)
    require_disjoint("send", send, out=out, lse=lse)
    if B and H:
        require_runnable_device(out)
    site = _pack.pack(out, lse, send, hpr, seq_lens, query_start_loc, with_site=key is not None)
    if key is not None:
        kept = _Kept(site)
        kept.hpr = hpr
        kept.send_bytes = _reach_bytes(send)
        kept.out_bytes, kept.lse_bytes = _reach_bytes(out), _reach_bytes(lse)
        _keep(_PACK_CALLS, key, kept)


def unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e, into=None):
    """Merge the received wire buffer ``recv[N, B, H/N, D+P]``.

    Returns ``out[B, H/N, D]`` in recv's dtype, and ``(out, lse[B, H/N] float32)`` when
    ``return_lse``. ``is_lse_base_on_e=False`` merges with exp2/log2 and returns a base-2 LSE.
    ``into``: a caller's ``[B, H/N, D]`` buffer of recv's dtype on recv's device (any strides;
    it must not overlap recv): the merged output is written there and ``into`` is returned in
    ``out``'s place, nothing allocated for it (the LSE, when asked for, is still a fresh
    tensor).
    """
    if compiling():
        if into is None:
            out, lse = _custom.unpack_combine(recv, head_dim, lse_pack_dim, return_lse,
                                              is_lse_base_on_e)
            return (out, lse) if return_lse else out
        lse = _custom.unpack_combine_into(recv, into, head_dim, lse_pack_dim, return_lse,
                                          is_lse_base_on_e)
        return (into, lse) if return_lse else into
    kept = key = None
    if type(recv) is _Tensor and (into is None or type(into) is _Tensor):
        try:
            pr = recv.data_ptr()
            key = (recv.shape, recv.stride(), recv.dtype, recv.device, pr & 15,
                   type(head_dim), head_dim, type(lse_pack_dim), lse_pack_dim,
                   type(return_lse), return_lse, type(is_lse_base_on_e), is_lse_base_on_e)
            if into is not None:
                pi = into.data_ptr()
                key = (*key, into.shape, into.stride(), into.dtype, into.device, pi & 15,
                       into.requires_grad)
            kept = _UNPACK_CALLS.get(key)
        except LOOKUP_ERRORS:
            key = None
    if kept is None or not kept.current() or kept.site is None:
        return _unpack_checked(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e,
                               key, kept, into)
    if into is None:
        out = torch.empty(kept.out_shape, dtype=kept.dtype, device=kept.device)
        po = out.data_ptr()
    else:
        out, po = into, pi
        ib = kept.into_bytes  # the overlap of the caller's buffer with recv: every call
        if ib and po < pr + kept.recv_bytes and pr < po + ib:
            require_disjoint("into", into, recv=recv)  # raises, naming the overlap
    if return_lse:
        lse = torch.empty(kept.lse_shape, dtype=torch.float32, device=kept.device)
        pl = lse.data_ptr()
        if (po & 15, pl & 15) == kept.aligns and kept.site(pr, pr, pl, po, po, pl):
            return out, lse
    elif (po & 15, po & 15) == kept.aligns and kept.site(pr, pr, po, po, po, po):
        return out
    return _combine.combine_packed(recv, head_dim, return_lse, is_lse_base_on_e, out=into)


def _unpack_checked(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e, key, kept,
                    into=None):
    """unpack_combine's every check (unless ``kept``: this key passed them), then the launch;
    the key is kept once the checks pass."""
    fresh = kept is None or not kept.current()
    if fresh:
        require_int("head_dim", head_dim, 1)
        require_bool("return_lse", return_lse)
        require_bool("is_lse_base_on_e", is_lse_base_on_e)
        N, B, hpr = check_wire_buffer("recv", recv, head_dim=head_dim,
                                      lse_pack_dim_=lse_pack_dim)
        if N < 1:
            raise ValueError("recv must hold at least one peer slice (N >= 1)")
        if into is not None:
            check_into(into, (B, hpr, head_dim), recv.dtype, recv.device)
        if B and hpr:
            require_runnable_device(recv)
    if into is not None:
        require_disjoint("into", into, recv=recv)
    if key is None:  # nothing to keep (a tensor subclass)
        return _combine.combine_packed(recv, head_dim, return_lse, is_lse_base_on_e, out=into)
    res, site = _combine.combine_packed(recv, head_dim, return_lse, is_lse_base_on_e,
                                        with_site=True, out=into)
    out, lse = res if return_lse else (res, res)
    if not fresh:
        # kept without a Site: its first launch could not be bound (a launch hook was on, a
        # stand-in held the kernel's name); this one may be -- else the key stayed on the
        # slow path for good (an eager-call probe, 2026-12-06: 28 us a call, not 12.6)
        if site is not None and (out.data_ptr() & 15, lse.data_ptr() & 15) == kept.aligns:
            kept.site = site
        return res
    kept = _Kept(site)
    kept.out_shape, kept.lse_shape = out.shape, lse.shape
    kept.dtype, kept.device = out.dtype, out.device
    kept.aligns = (out.data_ptr() & 15, lse.data_ptr() & 15)
    kept.recv_bytes = _reach_bytes(recv)
    kept.into_bytes = 0 if into is None else _reach_bytes(into)
    _keep(_UNPACK_CALLS, key, kept)
    return res
