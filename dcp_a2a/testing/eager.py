"""Eager-call time: what one call costs when an engine does not replay a CUDA graph.

An eager call is host work (argument checks, views, the launch table, building the launch)
plus Triton's launcher, and the GPU work behind it. ``eager_us`` makes ``calls`` back-to-back
calls and synchronises once at the end, ``repeats`` times, and takes the median per call: at
decode sizes the host is the bottleneck, so that is the host time of a call.

``eager_rows`` times, at one shape, our ``pack_send`` and ``unpack_combine``, the engine-design
baseline's unpack wrapper (:mod:`dcp_a2a.testing.engine_design`: allocate, grid, launch), the
straightforward pack's wrapper, ``lse_reduce`` (packed, a group of one: both kernels and the
staging, no exchange), and the floors: an empty Triton kernel with the same parameters, launched
with the very arguments each real launch gets (captured once, outside the timing), so that
"ours - floor" is our own host work and "floor" is Triton's launcher. It runs on CUDA and, as a
smoke test of its structure, on CPU through Triton's interpreter (the times then mean nothing).
"""

from __future__ import annotations

import statistics
import time

import torch
import triton
import triton.language as tl

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before the kernels are defined)

CALLS = 1000
REPEATS = 5


# --- empty twins of the kernels: the same parameters, no body -----------------------------------
# Triton's launcher binds, specialises and passes every argument whatever the body does, so an
# empty kernel launched with a real launch's arguments costs what the launcher costs.

@triton.jit
def _empty_pack(out_bits_ptr, lse_ptr, send_bits_ptr, seq_lens_ptr, qsl_ptr,
                B, H, HPR: tl.constexpr, D, num_seqs, steps,
                s_ob, s_oh, s_od, s_lb, s_lh,
                P: tl.constexpr, HAS_MASK: tl.constexpr,
                BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                STREAM: tl.constexpr, ONE_TILE: tl.constexpr, WIDE: tl.constexpr,
                LANE_LOADS: tl.constexpr, HEAD_MAJOR: tl.constexpr):
    pass


@triton.jit
def _empty_pack_slab(out_words_ptr, lse_ptr, send_words_ptr, seq_lens_ptr, qsl_ptr,
                     B, HPR4, num_seqs, steps, s_ob4, s_oh4, s_lb, s_lh,
                     G: tl.constexpr, W: tl.constexpr, VT: tl.constexpr, TT: tl.constexpr,
                     HAS_MASK: tl.constexpr, WIDE: tl.constexpr, HEAD_MAJOR: tl.constexpr):
    pass


@triton.jit
def _empty_combine(data_ptr, data_bits_ptr, lse_ptr, out_ptr, out_bits_ptr, lse_out_ptr,
                   B, HPR, D,
                   s_dn, s_db, s_dh, s_dd, s_ln, s_lb, s_lh, s_ob, s_oh, s_od,
                   N: tl.constexpr, LSE_LANES: tl.constexpr, BASE_E: tl.constexpr,
                   RETURN_LSE: tl.constexpr, IS_BF16: tl.constexpr, PAIRS: tl.constexpr,
                   BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_D: tl.constexpr, STREAM: tl.constexpr, ONE_TILE: tl.constexpr,
                   WIDE: tl.constexpr, NATIVE_BF16: tl.constexpr, SPLIT_D: tl.constexpr,
                   HEAD_MAJOR: tl.constexpr):
    pass


@triton.jit
def _empty_engine_unpack(recv_ptr, out_ptr, lse_out_ptr,
                         s_rn, s_rb, s_rh, s_rd, s_ob, s_oh, s_od, s_lb, s_lh,
                         N: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
                         BLOCK_D: tl.constexpr, BASE_E: tl.constexpr,
                         RETURN_LSE: tl.constexpr):
    pass


def twins():
    """{(module, kernel name): its empty twin}: the launches ``eager_rows`` captures."""
    from ..kernels import combine, pack
    from . import engine_design

    return {(pack, "_pack_kernel"): _empty_pack, (pack, "_pack_slab_kernel"): _empty_pack_slab,
            (combine, "combine_rows"): _empty_combine,
            (engine_design, "_unpack_combine_kernel"): _empty_engine_unpack}


class _Recorder:
    """Stands in for a kernel: ``kernel[grid](*args, **kw)`` records (grid, args, kw)."""

    def __init__(self, name, seen):
        self.name, self.seen = name, seen

    def __getitem__(self, grid):
        return lambda *args, **kw: self.seen.append((self.name, grid, args, kw))


def capture_launch(call):
    """(empty twin, grid, args, kw) of the one kernel launch ``call()`` makes, without making
    it (every kernel in ``twins()`` is swapped for a recorder meanwhile)."""
    table = twins()
    seen, saved = [], []
    for (mod, name) in table:
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, _Recorder((mod, name), seen))
    try:
        call()
    finally:
        for mod, name, k in saved:
            setattr(mod, name, k)
    if len(seen) != 1:
        raise AssertionError(f"expected one kernel launch, saw {len(seen)}")
    key, grid, args, kw = seen[0]
    return table[key], grid, args, kw


def eager_us(fn, calls: int = CALLS, repeats: int = REPEATS, sync=None):
    """(median us per call, every repeat's us per call): ``calls`` back-to-back calls of ``fn``,
    one ``sync()`` at the end, ``repeats`` times, after one untimed call (compiles, caches)."""
    sync = sync or (lambda: None)
    fn()
    sync()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs), runs


# op name: what it times (the table's legend)
OPS = {
    "pack_send": "ours: dcp_a2a.pack_send (checks + launch)",
    "unpack_combine": "ours: dcp_a2a.unpack_combine (checks + launch)",
    "engine_unpack": "engine-design baseline's wrapper (allocate, grid, launch)",
    "sf_pack": "straightforward pack's wrapper (grid, launch)",
    "floor_pack": "empty kernel, our pack launch's arguments (Triton's launcher)",
    "floor_unpack": "empty kernel, our unpack launch's arguments",
    "floor_engine_unpack": "empty kernel, the engine-design launch's arguments",
    "lse_reduce_n1": "ours: lse_reduce packed, group of one (pack + unpack + staging)",
}


def inputs(b, h, d, n, dtype_name, device, seed: int = 0):
    """(P, H/N, out[B, H, D], lse[B, H], send, recv): a seeded partial, a send buffer it was
    packed into and a copy of it to merge (the wire of a group that exchanged nothing)."""
    import dcp_a2a

    dtype = getattr(torch, dtype_name)
    p, hpr = dcp_a2a.lse_pack_dim(dtype), h // n
    g = torch.Generator().manual_seed(seed)
    out = torch.randn((b, h, d), generator=g).to(dtype).to(device)
    lse = (torch.randn((b, h), generator=g) * 4).to(device)
    send = torch.empty((n, b, hpr, d + p), dtype=dtype, device=device)
    dcp_a2a.pack_send(out, lse, send, n, hpr, d, p)
    return p, hpr, out, lse, send, send.clone()


def eager_rows(b, h, d, n, dtype_name, device, calls: int = CALLS,
               repeats: int = REPEATS) -> list[dict]:
    """One row per op of ``OPS`` at shape (B, H, D, N, dtype) on ``device``: the median us per
    call (``us``), every repeat's (``runs_us``), and for ours the part above the floor of its
    launch (``over_floor_us``)."""
    import dcp_a2a

    from . import engine_design
    from . import straightforward as sf

    device = torch.device(device)
    p, hpr, out, lse, send, recv = inputs(b, h, d, n, dtype_name, device)
    group = dcp_a2a.Group(1, 0, None)
    fns = {
        "pack_send": lambda: dcp_a2a.pack_send(out, lse, send, n, hpr, d, p),
        "unpack_combine": lambda: dcp_a2a.unpack_combine(recv, d, p, False, True),
        "engine_unpack": lambda: engine_design.unpack_combine(recv, d),
        "sf_pack": lambda: sf.pack(out, lse, send),
    }
    for floor, of in (("floor_pack", "pack_send"), ("floor_unpack", "unpack_combine"),
                      ("floor_engine_unpack", "engine_unpack")):
        twin, grid, args, kw = capture_launch(fns[of])
        fns[floor] = lambda twin=twin, grid=grid, args=args, kw=kw: twin[grid](*args, **kw)
    fns["lse_reduce_n1"] = lambda: dcp_a2a.lse_reduce(out, lse, group)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    shape = f"B={b} H={h} D={d} N={n} {dtype_name}"
    rows = []
    for op in OPS:
        us, runs = eager_us(fns[op], calls, repeats, sync)
        rows.append({"shape": shape, "op": op, "us": us, "runs_us": runs, "calls": calls,
                     "repeats": repeats})
    by_op = {r["op"]: r["us"] for r in rows}
    floors = {"pack_send": ("floor_pack",), "unpack_combine": ("floor_unpack",),
              "engine_unpack": ("floor_engine_unpack",),
              "lse_reduce_n1": ("floor_pack", "floor_unpack")}  # its two launches
    for r in rows:
        of = floors.get(r["op"])
        r["over_floor_us"] = r["us"] - sum(by_op[f] for f in of) if of else None
    return rows


def eager_table(rows: list[dict]) -> str:
    head = f"{'shape':32} {'op':20} {'us/call':>8} {'min':>8} {'max':>8} {'- floor':>8}  what"
    lines = [head, "-" * len(head)]
    for r in rows:
        over = "" if r["over_floor_us"] is None else f"{r['over_floor_us']:8.2f}"
        lines.append(f"{r['shape']:32} {r['op']:20} {r['us']:8.2f} {min(r['runs_us']):8.2f} "
                     f"{max(r['runs_us']):8.2f} {over:>8}  {OPS[r['op']]}")
    calls, repeats = rows[0]["calls"], rows[0]["repeats"]
    lines.append(f"eager: {calls} back-to-back calls, synchronised at the end; median of "
                 f"{repeats}; '- floor': us/call above empty kernels launched with the same "
                 "arguments (our host work)")
    return "\n".join(lines)
