"""``lse_reduce``: merge DCP attention partials across the group, three ways.

Each backend is written once as a generator of *steps*: it does its local work, yields the
collective it needs (``("all_to_all", (send, recv))``, ``("all_to_all_pair", (a, b))``,
``("all_gather", (local, gathered))``, ``("reduce_scatter", (scaled, merged))``), receives the
result and carries on. The same generator is driven either by ``torch.distributed``
(:func:`lse_reduce`) or by the in-process exchange of N generators (:mod:`dcp_a2a.inprocess`),
so the local work tested in one process is exactly the work done on real ranks.

Backends
  packed          pack out+LSE into one buffer, one ``all_to_all_single``, unpack-combine
  two_collective  output and LSE in two ``all_to_all_single`` calls issued async and waited
                  together, then the same combine kernel (bitwise equal to packed)
  ag_rs           all-gather the LSEs, weight the local output by exp(s_local - g),
                  reduce-scatter along heads (the sum runs in the output dtype)
  symm_mem        no collective: the pack kernel stores every slice into its owner's
                  symmetric-memory buffer and signals it, the combine kernel waits for the
                  signals (:mod:`dcp_a2a.kernels.direct`; needs ``buffers=SymmMemBuffers``);
                  the same combine arithmetic as packed, so bitwise equal to it
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Generator, NamedTuple

import torch

from . import _env
from .buffers import StagingBuffers, default_buffers
from .kernels.combine import combine_separate, scale_for_reduce_scatter
from .kernels.direct import combine_from_peers, pack_to_peers
from .kernels.pack import lse_to_wire
from .kernels.project import project
from . import custom_ops as _custom
from .ops import LOOKUP_ERRORS, compiling, index_key, keep, kept_table, pack_send, unpack_combine
from .symm_mem import SymmMemBuffers
from .up_projection import ORDERS as UP_PROJ_ORDERS
from .up_projection import choose as choose_up_proj_order
from .wire import (
    check_group,
    check_head_split,
    check_into,
    check_output_and_lse,
    check_seq_meta,
    check_seq_values,
    check_w_uv,
    lse_pack_dim,
    require_bool,
    require_disjoint,
    require_runnable_device,
)

BACKENDS = ("packed", "two_collective", "ag_rs", "symm_mem")
# opt-in: before the exchange, check with one small all-gather that every rank of the group makes
# the same call (see check_ranks_agree); "1" turns it on for every lse_reduce of the process
CHECK_RANKS_ENV = "DCP_A2A_CHECK_RANKS"

Step = tuple[str, Any]


@dataclass(frozen=True)
class Group:
    """The DCP group as ``lse_reduce`` sees it. Engines may pass any object with these three
    attributes (their own group coordinator). A plain record: what it holds is checked where it
    is used (``lse_reduce``, ``SymmMemBuffers``: ``world_size`` an int >= 1, ``rank_in_group``
    an int in [0, world_size), ``device_group`` a ProcessGroup of that size in which this
    process has that rank, or None for a group of one), each a ValueError/TypeError naming the
    field before any kernel or collective."""

    world_size: int
    rank_in_group: int
    device_group: Any  # a torch.distributed ProcessGroup (None is allowed for world_size 1)

    @classmethod
    def from_process_group(cls, pg=None) -> "Group":
        """The group of a torch.distributed ProcessGroup (default: the world), whose size and
        this process's rank in it it reads. TypeError for anything but a ProcessGroup or None,
        ValueError where torch.distributed is not initialised."""
        import torch.distributed as dist

        if pg is not None and not isinstance(pg, dist.ProcessGroup):
            raise TypeError(f"Group.from_process_group takes a torch.distributed.ProcessGroup "
                            f"(or None for the world), got {type(pg).__name__}")
        if pg is None and not (dist.is_available() and dist.is_initialized()):
            raise ValueError("Group.from_process_group() needs torch.distributed: call "
                             "torch.distributed.init_process_group first (or pass a "
                             "ProcessGroup)")
        pg = pg if pg is not None else dist.group.WORLD
        return cls(dist.get_world_size(pg), dist.get_rank(pg), pg)


def _check_process_group(pg, n: int, r: int) -> None:
    """A group of N > 1 needs a process group of N ranks in which this process is rank r:
    checked here, on the host and without a collective, so that a missing or mismatched group
    is a ValueError before any kernel runs, not an error (or a silently wrong merge: ag_rs
    weights the local output by the rank it is told) inside the collective. The rank is asked
    of the group object itself (``dist.get_rank(pg)`` refuses groups torch did not register)."""
    import torch.distributed as dist

    if pg is None:
        raise ValueError(
            f"group.device_group is None but world_size={n}: pass the torch.distributed "
            "ProcessGroup of the DCP group (None is only allowed for a group of one)")
    if not dist.is_available():
        raise ValueError(f"world_size={n} needs torch.distributed, which this torch lacks")
    if not isinstance(pg, dist.ProcessGroup):
        if not dist.is_initialized():
            raise ValueError(f"group.device_group is a {type(pg).__name__}, not a "
                             f"torch.distributed.ProcessGroup, and world_size={n} needs "
                             "torch.distributed: call torch.distributed.init_process_group "
                             "first and pass the DCP group's ProcessGroup")
        return
    if pg.size() != n:
        raise ValueError(f"group.device_group has {pg.size()} ranks but "
                         f"group.world_size={n}")
    if pg.rank() != r:
        raise ValueError(f"group.rank_in_group={r} but this process is rank {pg.rank()} of "
                         "group.device_group: the DCP group's rank must be the process "
                         "group's")


_DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def check_ranks_agree(out, lse, pg, n: int, *, backend: str, is_lse_base_on_e: bool,
                      wire_lanes: int | None = None) -> None:
    """Refuse (ValueError on every rank, naming the field and the ranks) a call whose B, H, D,
    output dtype, LSE base, backend or wire lanes a head (``wire_lanes``: the width the
    exchange carries, which the up-projection's order decides; default D) differ between the
    ranks of the group: they would abort the collective on one rank or return garbage on
    another. Costs one all-gather of 7 int64 and a host sync, so it is opt-in (``lse_reduce(check_ranks=True)`` or
    ``$DCP_A2A_CHECK_RANKS=1``) and skipped while a CUDA graph is being captured (the eager
    warm-up call before a capture runs it)."""
    if out.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    fields = ("B", "H", "D", "dtype", "LSE base", "backend", "wire lanes a head")
    names = {v: k for k, v in _DTYPE_CODES.items()}
    mine = [*out.shape, _DTYPE_CODES.get(out.dtype, -1), int(bool(is_lse_base_on_e)),
            BACKENDS.index(backend), out.shape[2] if wire_lanes is None else wire_lanes]
    shown = {3: lambda v: str(names.get(v, "?")).removeprefix("torch."),
             4: lambda v: "e" if v else "2", 5: lambda v: BACKENDS[v]}
    local = torch.tensor(mine, dtype=torch.int64, device=out.device)
    table = torch.empty(n * len(mine), dtype=torch.int64, device=out.device)
    _all_gather(table, local, pg)
    rows = table.view(n, len(mine)).tolist()
    problems = []
    for i, field in enumerate(fields):
        values = {}
        for rank, row in enumerate(rows):
            values.setdefault(row[i], []).append(rank)
        if len(values) > 1:
            show = shown.get(i, str)
            problems.append(f"{field}: " + "; ".join(
                f"{show(v)} on rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
                for v, rs in values.items()))
    if problems:
        raise ValueError("lse_reduce: the ranks of the group disagree on the call ("
                         + " | ".join(problems) + "); every rank must pass the same B, H, D, "
                         "dtype, LSE base and backend, and exchange as many lanes a head (the "
                         "up-projection's order: the same up_proj, w_uv and switch point)")


def _check_ranks_enabled(check_ranks) -> bool:
    if check_ranks is not None:  # a bool: checked by the caller
        return check_ranks
    return os.environ.get(CHECK_RANKS_ENV, "") not in ("", "0")


class _Call(NamedTuple):
    """One rank's checked arguments, as every backend takes them (a tuple: built on every
    call, where a frozen dataclass's per-field setattr costs host time)."""

    out: torch.Tensor
    lse: torch.Tensor
    world_size: int
    rank: int
    h_per_rank: int
    return_lse: bool
    is_lse_base_on_e: bool
    seq_lens: Any
    query_start_loc: Any
    buffers: StagingBuffers | SymmMemBuffers
    into: Any = None  # the caller's result buffer, or None
    w_uv: Any = None  # W_UV[H, L, V] of the up-projection, or None

    @property
    def avoid(self):  # staging must never alias the inputs, nor the caller's result buffer
        return (self.out, self.lse, self.into, self.w_uv)


_Tensor = torch.Tensor
# The calls whose checks below passed, by what those checks read (every tensor's shape, dtype
# and device, the other arguments' types and values, the interpreter switch): a later call of
# the same key skips them (an eager call's host time). Emptied by ops.forget_calls.
_CHECKED = kept_table()


def _tensor_key(t):
    """None, or what the checks of a caller's buffer or W_UV read of ``t``."""
    if t is None:
        return None
    return (type(t), t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def _check_call(out, lse, world_size, return_lse, is_lse_base_on_e, seq_lens, query_start_loc,
                backend, into=None, w_uv=None, up_proj="auto") -> int:
    """lse_reduce's checks that read no address and no buffer: H/N when they pass."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    require_bool("return_lse", return_lse)
    require_bool("is_lse_base_on_e", is_lse_base_on_e)
    if not isinstance(up_proj, str) or up_proj not in UP_PROJ_ORDERS:
        raise ValueError(f"up_proj={up_proj!r}: expected one of "
                         f"{', '.join(map(repr, UP_PROJ_ORDERS))}")
    B, H, D = check_output_and_lse(out, lse)
    hpr = check_head_split(H, world_size)
    check_seq_meta(seq_lens, query_start_loc, B, out.device)
    width = D
    if w_uv is not None:
        width = check_w_uv(w_uv, H, D, out.dtype, out.device)
    elif up_proj != "auto":
        raise ValueError(f"up_proj={up_proj!r} without w_uv: the order of the up-projection "
                         "only applies when lse_reduce projects (pass w_uv=W_UV[H, L, V])")
    if into is not None:
        check_into(into, (B, hpr, width), out.dtype, out.device)
    if B and H:
        require_runnable_device(out)
    return hpr


def lse_reduce_steps(out, lse, world_size: int, rank: int, *, return_lse=False,
                     is_lse_base_on_e=True, seq_lens=None, query_start_loc=None,
                     backend="packed", buffers: StagingBuffers | None = None, into=None,
                     w_uv=None, up_proj="auto") -> Generator[Step, Any, Any]:
    """Check the arguments, then return the backend as a generator of collective steps (its
    return value is what ``lse_reduce`` returns).

    The checks run here, when it is called, so bad input raises on every rank before any rank
    launches a kernel or enters a collective (no hung collective on a ValueError).
    """
    key = hpr = None
    if type(out) is _Tensor and type(lse) is _Tensor:
        try:
            key = (out.shape, out.dtype, out.device, lse.shape, lse.dtype, lse.device,
                   type(world_size), world_size, type(return_lse), return_lse,
                   type(is_lse_base_on_e), is_lse_base_on_e, index_key(seq_lens),
                   index_key(query_start_loc), backend, _env.INTERPRET)
            if into is not None or w_uv is not None or up_proj != "auto":
                key = (*key, _tensor_key(into), _tensor_key(w_uv), type(up_proj), up_proj)
            hpr = _CHECKED.get(key)
        except LOOKUP_ERRORS:
            key = None
    if hpr is None:
        hpr = _check_call(out, lse, world_size, return_lse, is_lse_base_on_e, seq_lens,
                          query_start_loc, backend, into, w_uv, up_proj)
        if key is not None:
            keep(_CHECKED, key, hpr)
    if seq_lens is not None and seq_lens.is_cpu:  # values on the host: checked every call
        check_seq_values(seq_lens, query_start_loc, out.shape[0])
    if into is not None:  # addresses: every call
        require_disjoint("into", into, out=out, lse=lse, seq_lens=seq_lens,
                         query_start_loc=query_start_loc, w_uv=w_uv)
    if backend == "symm_mem":
        if not isinstance(buffers, SymmMemBuffers):
            raise ValueError(
                "backend='symm_mem' needs buffers=SymmMemBuffers(group, max_tokens=..., "
                "num_heads=..., head_dim=..., dtype=...), created once on every rank of the "
                f"group; got buffers={type(buffers).__name__}")
        width = out.shape[2]
        if w_uv is not None:
            up_proj = _symm_mem_order(buffers, out, w_uv, up_proj)
            width = out.shape[2] if up_proj == "after_merge" else w_uv.shape[2]
        buffers.check_call(out, world_size, rank, head_dim=width)
        require_disjoint("the symm_mem receive buffer", buffers.tables.recv, out=out, lse=lse)
        if into is not None:
            require_disjoint("into", into, symm_mem_receive_buffer=buffers.tables.recv)
    elif buffers is not None and not isinstance(buffers, StagingBuffers):
        raise TypeError(f"backend={backend!r} takes buffers=StagingBuffers (or None), got "
                        f"{type(buffers).__name__}")
    call = _Call(out, lse, world_size, rank, hpr, return_lse, is_lse_base_on_e, seq_lens,
                 query_start_loc, buffers if buffers is not None else default_buffers(), into,
                 w_uv)
    if w_uv is None:
        return _BACKEND_STEPS[backend](call)
    B, H, L = out.shape
    order = choose_up_proj_order(up_proj, B, world_size, out.device, H, L, w_uv.shape[2],
                                 out.dtype)
    return _up_projected(call, _BACKEND_STEPS[backend], order)


def _symm_mem_order(buffers: SymmMemBuffers, out, w_uv, up_proj: str) -> str:
    """symm_mem's receive buffers hold one head width: the latent L (merge first) or the value
    width V (project first). "auto" takes the order they were made for; an order they cannot
    carry is a ValueError."""
    width = buffers.tables.head_dim
    L, V = out.shape[2], w_uv.shape[2]
    fits = [o for o, w in (("after_merge", L), ("before_exchange", V)) if w == width]
    if not fits:
        raise ValueError(f"these SymmMemBuffers hold head_dim={width}, but the up-projected "
                         f"exchange carries the latent L={L} (after_merge) or V={V} "
                         "(before_exchange): create them with one of those")
    if up_proj == "auto":
        return fits[0]
    if up_proj not in fits:
        lanes = V if up_proj == "before_exchange" else L
        raise ValueError(f"up_proj={up_proj!r} exchanges {lanes} lanes a head, but these "
                         f"SymmMemBuffers hold head_dim={width}: create them with "
                         f"head_dim={lanes}")
    return up_proj


def _up_projected(c: _Call, backend, order: str):
    """The backend's exchange with the up-projection by ``c.w_uv`` before it (every rank
    projects its partial, all H heads: the wire carries V lanes a head) or after it (the
    exchange merges the latent, this rank projects its own H/N heads)."""
    B, H, L = c.out.shape
    V = c.w_uv.shape[2]
    dtype, dev = c.out.dtype, c.out.device
    # scratch: the staging owner's (symm_mem's buffers hold only its receive slots)
    scratch = c.buffers if isinstance(c.buffers, StagingBuffers) else default_buffers()
    if order == "before_exchange":
        projected = scratch.get((B, H, V), dtype, dev, "up_proj.partial", c.avoid)
        project(c.out, c.w_uv, projected)
        # the projected partial is what the exchange must not overwrite now, with the caller's
        return (yield from backend(c._replace(out=projected, w_uv=None)))
    latent = scratch.get((B, c.h_per_rank, L), dtype, dev, "up_proj.latent", c.avoid)
    res = yield from backend(c._replace(into=latent, w_uv=None))
    merged, lse_out = res if c.return_lse else (res, None)
    own = c.w_uv[c.rank * c.h_per_rank:(c.rank + 1) * c.h_per_rank]
    result = c.into if c.into is not None else torch.empty((B, c.h_per_rank, V), dtype=dtype,
                                                           device=dev)
    project(merged, own, result)
    return (result, lse_out) if c.return_lse else result


def _packed(c: _Call):
    B, H, D = c.out.shape
    p = lse_pack_dim(c.out.dtype)
    send, recv = c.buffers.wire_pair((c.world_size, B, c.h_per_rank, D + p), c.out.dtype,
                                     c.out.device, avoid=c.avoid)
    # through the public ops: a problem they have checked once launches its kept Site
    pack_send(c.out, c.lse, send, c.world_size, c.h_per_rank, D, p, c.seq_lens,
              c.query_start_loc)
    recv = yield ("all_to_all", (send, recv))
    return unpack_combine(recv, D, p, c.return_lse, c.is_lse_base_on_e, into=c.into)


def _two_collective(c: _Call):
    B, H, D = c.out.shape
    n, dev = c.world_size, c.out.device
    data_send, data_recv = c.buffers.wire_pair((n, B, c.h_per_rank, D), c.out.dtype, dev,
                                               "data", c.avoid)
    lse_send, lse_recv = c.buffers.wire_pair((n, B, c.h_per_rank), torch.float32, dev, "lse",
                                             c.avoid)
    data_send.copy_(c.out.unflatten(1, (n, c.h_per_rank)).transpose(0, 1))
    lse_to_wire(c.lse, lse_send, n, c.seq_lens, c.query_start_loc)
    data_recv, lse_recv = yield ("all_to_all_pair", ((data_send, data_recv), (lse_send, lse_recv)))
    if c.into is not None:
        require_disjoint("into", c.into, recv=data_recv)
    return combine_separate(data_recv, lse_recv, c.return_lse, c.is_lse_base_on_e, out=c.into)


def _ag_rs(c: _Call):
    B, H, D = c.out.shape
    n, dev = c.world_size, c.out.device
    lse_local = c.buffers.get((B, H), torch.float32, dev, "ag_rs.lse", c.avoid)
    lse_to_wire(c.lse, lse_local, n, c.seq_lens, c.query_start_loc)
    lse_all = c.buffers.get((n, B, H), torch.float32, dev, "ag_rs.lse_all", c.avoid)
    lse_all = yield ("all_gather", (lse_local, lse_all))
    scaled = c.buffers.get((n, B, c.h_per_rank, D), c.out.dtype, dev, "ag_rs.scaled", c.avoid)
    lse_out = scale_for_reduce_scatter(c.out, lse_all, c.rank, c.return_lse,
                                       c.is_lse_base_on_e, dst=scaled)
    into = c.into
    if into is None:  # returned: the caller's
        merged = torch.empty((B, c.h_per_rank, D), dtype=c.out.dtype, device=dev)
    elif into.is_contiguous():  # the collective writes a contiguous buffer
        require_disjoint("into", into, reduce_scatter_input=scaled)
        merged = into
    else:
        merged = c.buffers.get((B, c.h_per_rank, D), c.out.dtype, dev, "ag_rs.merged", c.avoid)
    merged = yield ("reduce_scatter", (scaled, merged))
    if into is not None and merged is not into:
        merged = into.copy_(merged)
    return (merged, lse_out) if c.return_lse else merged


def _symm_mem(c: _Call):
    B, H, D = c.out.shape
    tables = c.buffers.tables
    if B and H:  # every rank has the same rows: with none, nobody signals and nobody waits
        pack_to_peers(c.out, c.lse, tables, c.seq_lens, c.query_start_loc)
    # The device-side signals order the exchange; this step only tells an in-process driver
    # that every rank's pack must run before any rank's combine.
    yield ("peers_signalled", None)
    if B and H:
        return combine_from_peers(tables, B, c.return_lse, c.is_lse_base_on_e, out=c.into)
    merged = c.into if c.into is not None else torch.empty((B, c.h_per_rank, D),
                                                           dtype=c.out.dtype,
                                                           device=c.out.device)
    lse_out = torch.empty((B, c.h_per_rank), dtype=torch.float32, device=c.out.device)
    return (merged, lse_out) if c.return_lse else merged


_BACKEND_STEPS = {"packed": _packed, "two_collective": _two_collective, "ag_rs": _ag_rs,
                  "symm_mem": _symm_mem}


# --------------------------------------------------------------------------- real collectives
def _all_gather(out, inp, group):
    import torch.distributed as dist

    # torch >= 2.13 renames all_gather_into_tensor (and warns on the old name)
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group)


def _reduce_scatter(out, inp, group):
    import torch.distributed as dist

    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group)


def _dist_step(kind: str, payload, pg, world_size: int):
    import torch.distributed as dist

    if kind == "peers_signalled":  # ordered on the device by the kernels' signals
        return None
    if world_size == 1:  # pass-through: nothing to exchange
        return _local_step(kind, payload)
    if kind == "all_to_all":
        send, recv = payload
        dist.all_to_all_single(recv, send, group=pg)
        return recv
    if kind == "all_to_all_pair":
        works = [dist.all_to_all_single(r, s, group=pg, async_op=True) for s, r in payload]
        for w in works:
            w.wait()
        return tuple(r for _, r in payload)
    if kind == "all_gather":
        local, gathered = payload
        _all_gather(gathered.view(-1), local.contiguous().view(-1), group=pg)
        return gathered
    if kind == "reduce_scatter":
        scaled, merged = payload
        _reduce_scatter(merged.view(-1), scaled.view(-1), group=pg)
        return merged
    raise AssertionError(f"unknown step {kind}")


def _local_step(kind: str, payload):
    """The exchange of a group of one: every collective is the identity."""
    if kind == "peers_signalled":
        return None
    if kind == "all_to_all":
        return payload[0]
    if kind == "all_to_all_pair":
        return tuple(s for s, _ in payload)
    if kind == "all_gather":
        local, gathered = payload
        gathered[0].copy_(local)
        return gathered
    if kind == "reduce_scatter":
        scaled, merged = payload  # copy: the result must not alias a staging buffer
        return merged.copy_(scaled[0])
    raise AssertionError(f"unknown step {kind}")


def drive(steps: Generator[Step, Any, Any], step_fn) -> Any:
    """Run a step generator to completion, answering each yielded step with ``step_fn``."""
    try:
        req = next(steps)
        while True:
            req = steps.send(step_fn(*req))
    except StopIteration as done:
        return done.value


def lse_reduce(out, lse, group, *, return_lse=False, is_lse_base_on_e=True, seq_lens=None,
               query_start_loc=None, backend="packed",
               buffers: StagingBuffers | SymmMemBuffers | None = None, check_ranks=None,
               into=None, w_uv=None, up_proj="auto"):
    """Merge this rank's DCP attention partial with its peers'.

    ``out[B, H, D]`` (fp16/bf16/fp32, any strides) and ``lse[B, H]`` (fp32/bf16/fp16) are this
    rank's partial over its KV shard. Returns ``out[B, H/N, D]`` for heads
    [r*H/N, (r+1)*H/N) in out's dtype, and ``(out, lse[B, H/N] float32)`` when ``return_lse``.
    ``group`` is any object with ``world_size``, ``rank_in_group`` and ``device_group``.
    ``backend="symm_mem"`` needs ``buffers=SymmMemBuffers(group, ...)`` made once per group.
    ``check_ranks`` (default: ``$DCP_A2A_CHECK_RANKS``): first check, with one small
    all-gather, that every rank passes the same B, H, D, dtype, LSE base and backend
    (:func:`check_ranks_agree`); off by default, it costs a collective and a host sync.

    ``into``: the caller's result buffer, ``[B, H/N, D]`` (``[B, H/N, V]`` with ``w_uv``) of
    out's dtype on out's device, any strides, overlapping nothing the call reads: the result
    is written there and ``into`` is returned in its place (nothing allocated for it).

    ``w_uv``: MLA's up-projection ``W_UV[H, L, V]`` (per head, vLLM's layout; out's dtype and
    device): ``out`` is then the latent partial ``[B, H, L]`` and the result is the merged
    output projected by W, ``[B, H/N, V]``. ``up_proj`` picks the order: ``"before_exchange"``
    (every rank projects its partial; the exchange carries V + P lanes a head),
    ``"after_merge"`` (the exchange carries the latent L + P lanes; this rank projects its
    merged heads by its W[r H/N : (r+1) H/N]) or ``"auto"`` (the default: before the exchange
    from the card's switch point on, :mod:`dcp_a2a.up_projection`). Every backend; symm_mem
    carries the one head width its SymmMemBuffers were made for (``"auto"`` takes that order).
    """
    if compiling():
        if backend != "packed" or buffers is not None or check_ranks:
            return _lse_reduce_eagerly(out, lse, group, return_lse=return_lse,
                                       is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
                                       query_start_loc=query_start_loc, backend=backend,
                                       buffers=buffers, check_ranks=check_ranks, into=into,
                                       w_uv=w_uv, up_proj=up_proj)
        return _compiled_lse_reduce(out, lse, group, return_lse, is_lse_base_on_e, seq_lens,
                                    query_start_loc, into, w_uv, up_proj)
    n, r = check_group(group)
    if check_ranks is not None:
        require_bool("check_ranks", check_ranks)
    steps = lse_reduce_steps(out, lse, n, r, return_lse=return_lse,
                             is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
                             query_start_loc=query_start_loc, backend=backend, buffers=buffers,
                             into=into, w_uv=w_uv, up_proj=up_proj)
    pg = group.device_group
    if n > 1:  # a group of one has no peers to disagree with (nor the env read's host time)
        _check_process_group(pg, n, r)
        if _check_ranks_enabled(check_ranks):
            check_ranks_agree(out, lse, pg, n, backend=backend, is_lse_base_on_e=is_lse_base_on_e,
                              wire_lanes=_wire_lanes(out, w_uv, up_proj, n, backend, buffers))
    return drive(steps, lambda kind, payload: _dist_step(kind, payload, pg, n))


def _wire_lanes(out, w_uv, up_proj: str, world_size: int, backend: str, buffers) -> int:
    """The head width the exchange carries: D, or with the up-projection L or V (called once
    lse_reduce_steps has checked the call)."""
    if w_uv is None:
        return out.shape[2]
    if backend == "symm_mem":
        order = _symm_mem_order(buffers, out, w_uv, up_proj)
    else:
        B, H, L = out.shape
        order = choose_up_proj_order(up_proj, B, world_size, out.device, H, L, w_uv.shape[2],
                                     out.dtype)
    return out.shape[2] if order == "after_merge" else w_uv.shape[2]


@torch._disable_dynamo
def _lse_reduce_eagerly(*args, **kwargs):
    """lse_reduce run eagerly from compiled code (a graph break; an error under
    fullgraph=True): the backends other than packed, caller-owned staging buffers and
    check_ranks (an all-gather and a host sync) have no traced form."""
    return lse_reduce(*args, **kwargs)


def _compiled_lse_reduce(out, lse, group, return_lse, is_lse_base_on_e, seq_lens,
                         query_start_loc, into, w_uv, up_proj):
    """lse_reduce as torch.compile traces it (dcp_a2a.custom_ops): the checks that read no
    address, then the pack, torch's functional all_to_all_single and the combine as ops of the
    graph (the ops check the rest, addresses included, when the graph runs); backend "packed",
    staging in the graph's own tensors."""
    n, r = check_group(group)
    hpr = _check_call(out, lse, n, return_lse, is_lse_base_on_e, seq_lens, query_start_loc,
                      "packed", None, w_uv, up_proj)
    B, H, D = out.shape
    p = lse_pack_dim(out.dtype)
    order, exchanged = None, out
    if w_uv is not None:
        V = w_uv.shape[2]
        order = choose_up_proj_order(up_proj, B, n, out.device, H, D, V, out.dtype)
        if order == "before_exchange":
            exchanged = out.new_empty((B, H, V))
            _custom.project(out, w_uv, exchanged)
    lanes = exchanged.shape[2]
    send = out.new_empty((n, B, hpr, lanes + p))
    _custom.pack_send(exchanged, lse, send, n, hpr, lanes, p, seq_lens, query_start_loc)
    if n > 1:
        from torch.distributed import _functional_collectives as funcol

        recv = funcol.all_to_all_single(send, None, None, group.device_group)
    else:
        recv = send
    if order == "after_merge":
        latent, lse_out = _custom.unpack_combine(recv, lanes, p, return_lse, is_lse_base_on_e)
        result = into if into is not None else out.new_empty((B, hpr, w_uv.shape[2]))
        _custom.project(latent, w_uv[r * hpr:(r + 1) * hpr], result)
    elif into is None:
        result, lse_out = _custom.unpack_combine(recv, lanes, p, return_lse, is_lse_base_on_e)
    else:
        lse_out = _custom.unpack_combine_into(recv, into, lanes, p, return_lse,
                                              is_lse_base_on_e)
        result = into
    return (result, lse_out) if return_lse else result
