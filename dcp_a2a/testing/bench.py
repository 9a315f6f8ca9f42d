"""Benchmark of the local work of each path on one GPU (the exchange skipped).

    python -m dcp_a2a.testing.bench [--out bench.json] [--quick] [--sweep]
    python -m dcp_a2a.testing.bench --grid [--quick] [--tables table,...] [--rounds 3]
        [--settle-rounds 9] [--target 0.95] [--out f.json]
    torchrun --nproc-per-node N -m dcp_a2a.testing.bench --collective [--shapes BxH,...] [--out f.json]

Per shape: pack, unpack-combine, packed total (pack + unpack), two_collective local work (output
permute copy + LSE staging + combine), ag_rs local work (LSE staging + weighting), and a naive
PyTorch version of pack + unpack. The device copy bandwidth is measured in the same run
(a large device-to-device copy, bytes read + written) and every row reports GB/s and % of it.
Small shapes are timed as CUDA-graph replays of many back-to-back calls; large ones with
``triton.testing.do_bench`` (median of event-timed runs). Beside the graph replays, the decode
shapes get eager-call times (:mod:`dcp_a2a.testing.eager`: 1000 back-to-back calls synchronised
at the end, median of 5) of our pack_send and unpack_combine, the engine-design baseline's
wrapper, lse_reduce (packed, a group of one) and the floor (an empty kernel launched with the
same arguments): the "eager" part of the JSON and its own table. ``--sweep`` times launch
variants (dcp_a2a.kernels.tuning) for pack and unpack-combine.

``--grid`` times ours next to two baselines at every point of the decode grid and reports the
ratios: the straightforward design (:mod:`dcp_a2a.testing.straightforward`: one program per
(token, head) and a run-time loop over the ranks, the first kernel an engine writes; the
target's baseline) and, for the unpack, the engine-design baseline
(:mod:`dcp_a2a.testing.engine_design`: the design of the unpack-combine kernel vLLM main ships,
so that falling behind the engine shows). At each point the baselines, a same-bytes copy and
each table's kernel run in ``--rounds`` interleaved rounds, medians reported (at the launch
floor one timing moves by more than the 5 % a verdict there needs). Each table's kernel then
gets a verdict against ``--target`` x the straightforward kernel's time: "met", "missed" or
"undecided", from a 95 % confidence interval of its time over the straightforward kernel's,
round by round (see ``ratio_verdict``); an op whose verdict is undecided is timed again, up to
``--settle-rounds`` rounds in all, and decided on every round it has. The unpack also gets a
verdict against ``ENGINE_TARGET`` x the engine-design kernel's time, from the same rounds.

``--collective`` (under torchrun, one rank per GPU, NCCL) times the real exchange end to end:
``lse_reduce`` with each backend (packed, two_collective, ag_rs, and symm_mem on NCCL groups of
CUDA ranks), median over iterations, as CUDA-graph replays where the path captures (NCCL
collectives and symm_mem do) and with events otherwise, after ``WARMUP_MS`` of untimed calls
(their number agreed by the ranks); rank 0 prints the table, each backend's
time over packed's and packed's over symm_mem's (its speed-up). Without CUDA it runs on gloo
with CPU tensors (a smoke test of the code path; the times mean nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from . import eager
from ..kernels import tuning
from ..kernels.combine import combine_separate, scale_for_reduce_scatter
from ..ops import pack_send, unpack_combine
from ..kernels.pack import lse_to_wire
from ..wire import lse_pack_dim

DEFAULT_SHAPES = [
    # (B, H, D, N, dtype)       upstream microbenchmark, then decode shapes, then small heads
    (8192, 64, 512, 4, "bfloat16"),
    (8192, 64, 512, 8, "bfloat16"),
    (1, 128, 512, 8, "bfloat16"),
    (16, 128, 512, 8, "bfloat16"),
    (128, 128, 512, 8, "bfloat16"),
    (512, 128, 512, 8, "bfloat16"),
    (256, 32, 128, 4, "float16"),
    (256, 32, 128, 4, "float32"),
]
# Eager-call times at shapes of at most this many rows (B x H): above, the GPU's work, not the
# host's, sets the time of back-to-back eager calls.
EAGER_MAX_ROWS = 16384
# Below this many bytes moved, time CUDA-graph replays: kernels of up to ~250 us would otherwise
# be timed with the host's launch overhead in them (the decode path runs under graphs).
GRAPH_BYTES_LIMIT = 1 << 30


@dataclass
class Row:
    shape: str
    op: str
    variant: str
    us: float
    bytes: int
    gbps: float
    pct_copy: float
    method: str


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    import triton.testing

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300,
                                 return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9


# Graph replays timed with no warm-up read up to 11 % slow (the quick benchmark's B=8192 unpack,
# timed right after its kernel's first call; docs/perf_history.md, twelfth pass): the graph is
# replayed untimed for this long before the timed replays, as do_bench warms up for 25 ms.
WARMUP_MS = 25.0
WARMUP_MAX_CALLS = 10_000  # a call timed at ~0 would otherwise ask for no end of calls


def _warm_up_calls(ms: float, ms_per_call: float) -> int:
    """Calls of ``ms_per_call`` that make up at least ``ms`` (at most WARMUP_MAX_CALLS)."""
    return 0 if ms <= 0 else min(WARMUP_MAX_CALLS, math.ceil(ms / max(ms_per_call, 1e-3)))


def _warm_up(replay, ms: float) -> None:
    """Run ``replay`` untimed until ``ms`` milliseconds of GPU time have passed (at most
    WARMUP_MAX_CALLS replays), measured with events around batches that double. A count taken
    from the first replay alone fell short, because that replay also uploads the graph and is
    slower than the rest: an H100 warmed up for 17.8 of the 20 ms asked."""
    done, calls, batch = 0.0, 0, 1
    while done < ms and calls < WARMUP_MAX_CALLS:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            replay()
        b.record()
        torch.cuda.synchronize()
        done, calls, batch = done + a.elapsed_time(b), calls + batch, min(2 * batch, 1024)


def time_us(fn, nbytes: int, reps_in_graph: int | None = None,
            warmup_ms: float | None = None) -> tuple[float, str]:
    """Median microseconds per call: CUDA-graph replays of back-to-back calls below
    GRAPH_BYTES_LIMIT moved (fewer calls per graph for bigger ones), after ``warmup_ms``
    (default WARMUP_MS) of untimed replays; events above (``do_bench``, which warms up alike)."""
    import triton.testing

    if nbytes >= GRAPH_BYTES_LIMIT:
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        return ms * 1e3, "events"
    if reps_in_graph is None:
        reps_in_graph = max(2, min(50, (256 << 20) // max(nbytes, 1)))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps_in_graph):
            fn()
    _warm_up(g.replay, WARMUP_MS if warmup_ms is None else warmup_ms)
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps_in_graph)
    times.sort()
    return times[len(times) // 2], "graph"


def timed_rounds(variants: dict, nbytes: int, rounds: int = 3, timer=None):
    """Time each of ``variants`` (name: callable moving ``nbytes``) once a round, ``rounds``
    rounds, interleaved (a drift of the machine then reaches every variant alike): (median us
    by name, every round's us by name, how they were timed). ``timer``: ``time_us``'s
    signature, for tests."""
    timer = timer or time_us
    times, method = {k: [] for k in variants}, None
    for _ in range(rounds):
        for name, fn in variants.items():
            us, method = timer(fn, nbytes)
            times[name].append(us)
    return {k: statistics.median(v) for k, v in times.items()}, times, method


# Issue "kernels ahead of vLLM's": every grid point at most this times the straightforward time.
TARGET_RATIO = 0.95
# Issue 47: the unpack at most the engine-design kernel's time (no slower than the engine).
ENGINE_TARGET = 1.0


def ratio_verdict(ours, base, target=TARGET_RATIO, confidence=0.95):
    """Is ``ours`` at most ``target`` x ``base``? ``ours`` and ``base`` are per-round times of
    the same interleaved rounds, so round i's ratio ``ours[i] / base[i]`` is paired (a drift of
    the machine during a round reaches both). The ratios' logs get a one-sample t interval
    (scipy.stats.ttest_1samp) at ``confidence``; exponentiated, (lo, hi) bound the ratios'
    geometric mean. Verdict "met" if hi <= target, "missed" if lo > target, otherwise "undecided". With
    one round there is no interval: (nan, nan, "undecided")."""
    import warnings

    import numpy as np
    from scipy import stats

    if len(ours) != len(base) or not ours:
        raise ValueError(f"need as many rounds of ours as of base, got {len(ours)} and "
                         f"{len(base)}")
    logs = np.log(np.asarray(ours, dtype=float)) - np.log(np.asarray(base, dtype=float))
    if len(logs) < 2:
        return float("nan"), float("nan"), "undecided"
    with warnings.catch_warnings():  # equal ratios every round: a zero-width interval
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.exp(stats.ttest_1samp(logs, 0.0).confidence_interval(confidence))
    if np.isnan(lo):  # every round the same ratio: its interval is that ratio
        lo = hi = float(np.exp(logs[0]))
    verdict = "met" if hi <= target else "missed" if lo > target else "undecided"
    return float(lo), float(hi), verdict


def timed_verdicts(variants: dict, nbytes: int, judged, rounds: int, settle_rounds: int = 0,
                   target: float = TARGET_RATIO, timer=None):
    """``timed_rounds`` of ``variants`` (one of them named "sf", the straightforward kernel),
    then a ``ratio_verdict`` of each name in ``judged`` against "sf". If any is undecided and
    ``settle_rounds`` > ``rounds``, every variant gets ``settle_rounds - rounds`` more rounds
    and the verdicts are taken again on all of them (two looks at the data, no more: a
    verdict is not fished for; by Bonferroni the two looks at most double a wrong verdict's
    chance, 2.5 % a side at 95 %). Returns (medians, every round's times, timing method,
    {name: (lo, hi, verdict)})."""
    med, times, method = timed_rounds(variants, nbytes, rounds, timer)

    def judge():
        return {k: ratio_verdict(times[k], times["sf"], target) for k in judged}

    verdicts = judge()
    if settle_rounds > rounds and any(v[2] == "undecided" for v in verdicts.values()):
        _, more, method = timed_rounds(variants, nbytes, settle_rounds - rounds, timer)
        for k in times:
            times[k] += more[k]
        med = {k: statistics.median(v) for k, v in times.items()}
        verdicts = judge()
    return med, times, method, verdicts


def naive_torch(out, lse, send, n, hpr, d):
    """Pack and unpack-combine in plain PyTorch ops (the baseline an engine would start from)."""
    b = out.shape[0]
    send[..., :d].copy_(out.view(b, n, hpr, d).transpose(0, 1))
    lanes = send.view(torch.int16 if send.element_size() == 2 else torch.int32)[..., d:]
    lanes.copy_(lse.float().view(b, n, hpr).transpose(0, 1).contiguous()
                .view(lanes.dtype).view(lanes.shape))
    recv = send
    lse_r = recv.view(lanes.dtype)[..., d:].contiguous().view(torch.float32).squeeze(-1)
    w = torch.softmax(lse_r, dim=0)
    return (w[..., None] * recv[..., :d].float()).sum(0).to(out.dtype)


def _inputs(b, h, d, n, dtype_name):
    """(dtype, element size, P, H/N, out[B, H, D], lse[B, H] fp32, send[N, B, H/N, D+P]) on
    the GPU, random (never zeros: they hide unwritten outputs and time differently)."""
    dtype = getattr(torch, dtype_name)
    p = lse_pack_dim(dtype)
    out = torch.randn((b, h, d), device="cuda").to(dtype)
    lse = torch.randn((b, h), device="cuda") * 4
    send = torch.empty((n, b, h // n, d + p), dtype=dtype, device="cuda")
    return dtype, out.element_size(), p, h // n, out, lse, send


def bench_shape(b, h, d, n, dtype_name, copy_gbps, sweep=False) -> list[Row]:
    dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dtype_name)
    pack_send(out, lse, send, n, hpr, d, p)
    recv = send.clone()
    data_send = torch.empty((n, b, hpr, d), dtype=dtype, device="cuda")
    lse_send = torch.empty((n, b, hpr), dtype=torch.float32, device="cuda")
    lse_local = torch.empty((b, h), dtype=torch.float32, device="cuda")
    lse_all = (torch.randn((n, b, h), device="cuda") * 4)
    scaled = torch.empty((n, b, hpr, d), dtype=dtype, device="cuda")
    shape = f"B={b} H={h} D={d} N={n} {dtype_name}"

    wire = n * b * hpr * (d + p) * es
    io = b * h * d * es
    merged = b * hpr * d * es
    ops = {
        "pack": (lambda: pack_send(out, lse, send, n, hpr, d, p), io + b * h * 4 + wire),
        "unpack_combine": (lambda: unpack_combine(recv, d, p, False, True), wire + merged),
        "packed_total": (lambda: (pack_send(out, lse, send, n, hpr, d, p),
                                  unpack_combine(send, d, p, False, True)),
                         io + b * h * 4 + 2 * wire + merged),
        "two_collective_local": (
            lambda: (data_send.copy_(out.unflatten(1, (n, hpr)).transpose(0, 1)),
                     lse_to_wire(lse, lse_send, n),
                     combine_separate(data_send, lse_send, False, True)),
            2 * io + b * h * 8 + io + b * h * 4 + merged),
        "ag_rs_local": (lambda: (lse_to_wire(lse, lse_local, n),
                                 scale_for_reduce_scatter(out, lse_all, 0, False, True, scaled)),
                        b * h * 8 + n * b * h * 4 + 2 * io),
        "naive_torch": (lambda: naive_torch(out, lse, send, n, hpr, d),
                        io + b * h * 4 + 2 * wire + merged),
    }
    rows = []
    for name, (fn, nbytes) in ops.items():
        us, method = time_us(fn, nbytes)
        gbps = nbytes / (us * 1e-6) / 1e9
        rows.append(Row(shape, name, "default", us, nbytes, gbps, 100 * gbps / copy_gbps, method))
    if sweep:
        rows += _sweep(shape, ops, copy_gbps, h, hpr, d)
    return rows


def _sweep(shape, ops, copy_gbps, h, hpr, d) -> list[Row]:
    rows = []
    for which, op in (("pack", "pack"), ("combine", "unpack_combine")):
        heads = h if which == "pack" else hpr
        for bh, bd, nw, stream in _variants(heads, d):
            tuning.OVERRIDES[which] = tuning.Launch(bh, bd, nw, stream)
            fn, nbytes = ops[op]
            try:
                us, method = time_us(fn, nbytes)
            finally:
                tuning.OVERRIDES.pop(which, None)
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append(Row(shape, op, f"bh={bh} bd={bd} w={nw}" + " cs" * stream, us,
                            nbytes, gbps, 100 * gbps / copy_gbps, method))
    return rows


def _variants(heads, d):
    """Launch variants around the defaults (block sizes count 32-bit words on the paired path)."""
    for bh in (1, 2, 4, 8, 16, 32):
        if bh > heads:
            continue
        for bd in (64, 128, 256, 512):
            if bd > max(64, d) or bh * bd > 8192 or bh * bd < 64:
                continue
            for nw in (2, 4, 8):
                for stream in (False, True):
                    yield bh, bd, nw, stream


# --------------------------------------------------------------------------- ours vs straightforward
GRID_B = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 8192)
GRID_HN = ((128, 8), (64, 4), (64, 8), (32, 4), (16, 2))


def grid_points(quick: bool = False):
    """(B, H, N, D, dtype) of the comparison grid: bf16 at D in {512, 128, 64, 80}; fp16 and
    fp32 at D in {128, 512}. ``quick``: B in {1, 128, 8192}, (H, N) in {(128, 8), (64, 4)}."""
    bs = (1, 128, 8192) if quick else GRID_B
    hns = GRID_HN[:2] if quick else GRID_HN
    for dt, ds in (("bfloat16", (512, 128, 64, 80)), ("float16", (128, 512)),
                   ("float32", (128, 512))):
        for d in ds:
            for h, n in hns:
                for b in bs:
                    yield b, h, n, d, dt


def grid_point(b, h, n, d, dtype_name, copy_gbps, tables=("table",), rounds=3,
               settle_rounds=0, target=TARGET_RATIO) -> dict:
    """Pack and unpack-combine, ours and the straightforward design's, on one shape; the
    straightforward result is checked against ours, and every table's pack against those
    bytes, before anything is timed. Per op, the straightforward kernel, a device copy of the
    same bytes and each table's kernel are timed in interleaved rounds (``timed_verdicts``:
    ``rounds``, up to ``settle_rounds`` where a verdict is undecided; ``{op}_rounds`` says how
    many, ``{op}_times_us`` holds them all). Medians are reported; ``{op}_spread`` is the
    largest max / min over rounds of any kernel; ``{op}_ratio_ci`` and ``{op}_verdict`` are
    ``ratio_verdict``'s against ``target``. A kernel whose rules two tables share is timed
    once."""
    from . import engine_design
    from . import straightforward as sf

    dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dtype_name)
    recv = torch.empty_like(send)
    sf.pack(out, lse, send)
    pack_send(out, lse, recv, n, hpr, d, p)
    if not torch.equal(send.view(torch.uint8), recv.view(torch.uint8)):
        raise AssertionError(f"straightforward pack differs from ours at {b}x{h}x{d} N={n}")
    ref = unpack_combine(recv, d, p, False, True).float()
    for name, base in (("straightforward", sf.unpack_combine),
                       ("engine-design", engine_design.unpack_combine)):
        if not torch.allclose(base(recv, d).float(), ref, rtol=2 ** -6, atol=2 ** -6):
            raise AssertionError(f"{name} unpack differs from ours at {b}x{h}x{d} N={n}")
    wire = n * b * hpr * (d + p) * es
    pack_bytes = b * h * d * es + b * h * 4 + wire
    unpack_bytes = wire + b * hpr * d * es
    row = {"B": b, "H": h, "N": n, "D": d, "dtype": dtype_name, "rounds": rounds,
           "target": target, "tables": {}}
    ops = (("pack", lambda: pack_send(out, lse, send, n, hpr, d, p),
            lambda: sf.pack(out, lse, send), pack_bytes),
           ("unpack", lambda: unpack_combine(recv, d, p, False, True),
            lambda: sf.unpack_combine(recv, d), unpack_bytes))

    def under(name, fn):
        def run():
            tuning.ACTIVE = tuning.CANDIDATES[name]
            try:
                fn()
            finally:
                tuning.ACTIVE = tuning.TABLE
        return run

    for name in tables:  # every table's pack writes the bytes checked above
        send.view(torch.uint8).fill_(0xFF)
        under(name, ops[0][1])()
        if not torch.equal(send.view(torch.uint8), recv.view(torch.uint8)):
            raise AssertionError(f"table {name}: pack differs at {b}x{h}x{d} N={n}")

    for op, ours, base, nbytes in ops:
        # the floor for any kernel moving these bytes: a device copy of as many, timed alike
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        variants = {"sf": base, "copy": lambda src=src, dst=dst: dst.copy_(src)}
        if op == "unpack":  # the engine-design baseline, timed in the same rounds
            variants["engine"] = lambda: engine_design.unpack_combine(recv, d)
        rules_of = {name: tuning.CANDIDATES[name]["pack" if op == "pack" else "combine"]
                    for name in tables}
        timed_as = {}  # rules -> the first table that has them (its kernel is timed)
        for name in tables:
            if timed_as.setdefault(rules_of[name], name) == name:
                variants["table:" + name] = under(name, ours)
        judged = [k for k in variants if k.startswith("table:")]
        med, times, row[f"{op}_timing"], verdicts = timed_verdicts(
            variants, nbytes, judged, rounds, settle_rounds, target)
        del src, dst, variants
        row[f"{op}_rounds"], row[f"{op}_times_us"] = len(times["sf"]), times
        row[f"{op}_straightforward_us"], row[f"{op}_copy_us"] = med["sf"], med["copy"]
        row[f"{op}_spread"] = max(max(v) / min(v) for v in times.values())
        for name in reversed(tables):  # the first table last: its rows are the headline numbers
            timed = "table:" + timed_as[rules_of[name]]
            us, (lo, hi, verdict) = med[timed], verdicts[timed]
            row["tables"].setdefault(name, {}).update(
                {f"{op}_us": us, f"{op}_ratio_ci": [lo, hi], f"{op}_verdict": verdict})
            row[f"{op}_us"], row[f"{op}_ratio_ci"], row[f"{op}_verdict"] = us, [lo, hi], verdict
            row[f"{op}_ratio"] = us / row[f"{op}_straightforward_us"]
            row[f"{op}_pct_copy"] = 100 * nbytes / (us * 1e-6) / 1e9 / copy_gbps
        if "engine" in times:  # the first table's kernel against the engine design
            ours_rounds = times["table:" + timed_as[rules_of[tables[0]]]]
            lo, hi, verdict = ratio_verdict(ours_rounds, times["engine"], ENGINE_TARGET)
            row[f"{op}_engine_us"] = med["engine"]
            row[f"{op}_engine_ratio"] = row[f"{op}_us"] / med["engine"]
            row[f"{op}_engine_round_ratio"] = statistics.median(
                a / e for a, e in zip(ours_rounds, times["engine"]))
            row[f"{op}_engine_ratio_ci"], row[f"{op}_engine_verdict"] = [lo, hi], verdict
    return row


_MARK = {"met": "ok", "undecided": "?", "missed": "MISS"}


def grid_table(rows: list[dict]) -> str:
    # "copy us": a device copy of the same bytes (the floor for any kernel that moves them);
    # "v": the verdict against the target (ok, ? undecided, MISS)
    head = (f"{'B':>5} {'H':>4} {'N':>2} {'D':>4} {'dtype':<8} | {'pack us':>8} {'sf us':>8} "
            f"{'copy us':>8} {'ratio':>6} {'v':>4} {'%copy':>6} | {'unpack us':>9} {'sf us':>8} "
            f"{'copy us':>8} {'ratio':>6} {'v':>4} {'%copy':>6}")
    # "eng us", "/eng": the engine-design unpack and ours over it (rows timed before it was in
    # the grid leave them blank)
    engine = any("unpack_engine_us" in r for r in rows)
    if engine:
        head += f" | {'eng us':>8} {'/eng':>6} {'v':>4}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r['B']:>5} {r['H']:>4} {r['N']:>2} {r['D']:>4} {r['dtype']:<8} | "
            f"{r['pack_us']:>8.2f} {r['pack_straightforward_us']:>8.2f} "
            f"{r['pack_copy_us']:>8.2f} {r['pack_ratio']:>6.3f} "
            f"{_MARK[r['pack_verdict']]:>4} {r['pack_pct_copy']:>6.1f} | {r['unpack_us']:>9.2f} "
            f"{r['unpack_straightforward_us']:>8.2f} "
            f"{r['unpack_copy_us']:>8.2f} {r['unpack_ratio']:>6.3f} "
            f"{_MARK[r['unpack_verdict']]:>4} {r['unpack_pct_copy']:>6.1f}")
        if engine and "unpack_engine_us" in r:
            line += (f" | {r['unpack_engine_us']:>8.2f} {r['unpack_engine_ratio']:>6.3f} "
                     f"{_MARK[r['unpack_engine_verdict']]:>4}")
        lines.append(line)
    worst = max(rows, key=lambda r: max(r["pack_ratio"], r["unpack_ratio"]))
    lines.append(f"worst ratio (ours / straightforward): pack {max(r['pack_ratio'] for r in rows):.3f}"
                 f", unpack {max(r['unpack_ratio'] for r in rows):.3f} (at B={worst['B']} "
                 f"H={worst['H']} N={worst['N']} D={worst['D']} {worst['dtype']})")
    spreads = sorted(r[f"{op}_spread"] for r in rows for op in ("pack", "unpack"))
    timed = [(r[f"{op}_rounds"], r["rounds"]) for r in rows for op in ("pack", "unpack")]
    settled = sum(got > asked for got, asked in timed)
    lines.append(f"medians of {rows[0]['rounds']} interleaved rounds ({settled} ops, undecided "
                 f"after them, timed again: up to {max(timed)[0]} rounds); a kernel's max / min "
                 f"over them: median {spreads[len(spreads) // 2]:.3f}, worst {spreads[-1]:.3f}")
    counts = {op: {v: sum(r[f"{op}_verdict"] == v for r in rows) for v in _MARK}
              for op in ("pack", "unpack")}
    lines.append(f"verdicts at {rows[0]['target']} x straightforward (95 % interval of the "
                 f"per-round ratio): " + "; ".join(
                     f"{op} " + ", ".join(f"{c[v]} {v}" for v in _MARK)
                     for op, c in counts.items()))
    judged = [r for r in rows if "unpack_engine_us" in r]
    if judged:
        worst = max(judged, key=lambda r: r["unpack_engine_ratio"])
        c = {v: sum(r["unpack_engine_verdict"] == v for r in judged) for v in _MARK}
        lines.append(
            f"unpack vs the engine design (at most {ENGINE_TARGET} x its time): "
            + ", ".join(f"{c[v]} {v}" for v in _MARK)
            + f"; worst ratio {worst['unpack_engine_ratio']:.3f} at B={worst['B']} "
            f"H={worst['H']} N={worst['N']} D={worst['D']} {worst['dtype']}")
    # Over the copy of the same bytes, timed in the same rounds: a target below 1 asks for a
    # kernel faster than the device's own copy of its bytes; on an H200 ours gets there only
    # where the bytes are about L2's size (docs/perf.md).
    lines.append("not met (verdict, op, point: ratio of medians [interval]; ours and the "
                 "target over the copy):")
    for r in rows:
        for op in ("pack", "unpack"):
            if r[f"{op}_verdict"] != "met":
                lo, hi = r[f"{op}_ratio_ci"]
                copy = r[f"{op}_copy_us"]
                goal = r["target"] * r[f"{op}_straightforward_us"] / copy
                lines.append(f"  {r[f'{op}_verdict']:>9} {op:<6} B={r['B']} H={r['H']} "
                             f"N={r['N']} D={r['D']} {r['dtype']}: {r[f'{op}_ratio']:.3f} "
                             f"[{lo:.3f}, {hi:.3f}] over {r[f'{op}_rounds']} rounds; "
                             f"copy x {r[f'{op}_us'] / copy:.3f}, target copy x {goal:.3f}"
                             + (" (below the copy)" if goal < 1 else ""))
    return "\n".join(lines)


def grid_main(args) -> int:
    copy_gbps = copy_bandwidth()
    rows = []
    tables = [t for t in (args.tables or "table").split(",") if t]
    props = torch.cuda.get_device_properties(0)
    import triton

    for point in tqdm(list(grid_points(args.quick)), desc="grid", mininterval=10):
        rows.append(grid_point(*point, copy_gbps, tables, args.rounds, args.settle_rounds,
                               args.target))
        # rewritten after every point: a run cut short still leaves what it measured
        with open(args.out, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__,
                       "triton": triton.__version__, "copy_gbps": copy_gbps,
                       "tables": tables, "grid": rows}, f, indent=1)
    print(f"device {props.name}; copy bandwidth {copy_gbps:.0f} GB/s (read + write)")
    print(grid_table(rows))
    return 0


def table(rows: list[Row]) -> str:
    head = f"{'shape':34} {'op':22} {'variant':18} {'us':>9} {'GB/s':>8} {'%copy':>6} {'timing':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.shape:34} {r.op:22} {r.variant:18} {r.us:9.2f} {r.gbps:8.0f} "
                     f"{r.pct_copy:6.1f} {r.method:>6}")
    return "\n".join(lines)


COLLECTIVE_SHAPES = [(b, h) for h in (64, 128) for b in (1, 16, 128, 1024, 8192)]


def agreed_warmup_calls(ms_per_call: float, warmup_ms: float, device,
                        group=None) -> int:
    """Untimed calls that make up at least ``warmup_ms`` at each rank's own ``ms_per_call``: the
    most any rank of ``group`` asks for, the same number on every rank. Each call is a
    collective, so ranks that ran different counts would leave one waiting in its last call for
    peers that never join."""
    import torch.distributed as dist

    n = torch.tensor([_warm_up_calls(warmup_ms, ms_per_call)], dtype=torch.int64, device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX, group=group)
    return int(n.item())


def _time_collective(fn, device, iters: int) -> tuple[float, str, int]:
    """Median microseconds of one ``fn()`` (a collective) over ``iters`` calls, each started
    after a barrier: CUDA-graph replays where ``fn`` captures, events where it does not, wall
    clock on CPU ranks; after WARMUP_MS of untimed calls, as ``time_us`` warms up. Returns (us,
    method, untimed calls)."""
    import time

    import torch.distributed as dist

    for _ in range(3):
        fn()
    runner, method = fn, ("events" if device.type == "cuda" else "wall")
    # Only NCCL's collectives capture. Trying to capture a gloo collective is not just a failed
    # capture: gloo's own thread copies CUDA tensors while this one captures, and that error
    # surfaces later, in the next barrier (seen on one H200 with 2 gloo ranks sharing it).
    if device.type == "cuda" and dist.get_backend() == "nccl":
        try:
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            runner, method = g.replay, "graph"
        except Exception:  # a path that does not capture: plain launches
            torch.cuda.synchronize()
    if device.type == "cuda":

        def once() -> float:  # ms
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            runner()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b)
    else:

        def once() -> float:
            t0 = time.perf_counter()
            runner()
            return (time.perf_counter() - t0) * 1e3
    dist.barrier()
    warm = agreed_warmup_calls(once(), WARMUP_MS, device)
    for _ in range(warm):
        runner()
    times = []
    for _ in range(iters):
        dist.barrier()
        times.append(once() * 1e3)
    times.sort()
    return times[len(times) // 2], method, warm + 1


def collective_main(args) -> int:
    """End-to-end lse_reduce per backend on the real group (run under torchrun)."""
    import os

    import torch.distributed as dist

    from ..collective import BACKENDS, Group, lse_reduce
    from ..symm_mem import SymmMemBuffers

    from .rankpool import auto_backend, rank_device

    backend = auto_backend()
    device = rank_device(backend, int(os.environ.get("LOCAL_RANK", "0")))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    # the device bound to an NCCL group: its barriers use it (unbound, each warns it guessed)
    dist.init_process_group(backend, **({"device_id": device} if backend == "nccl" else {}))
    rank, world = dist.get_rank(), dist.get_world_size()
    group = Group.from_process_group()
    # symm_mem stores into peers' GPU memory: NCCL groups of CUDA ranks only
    backends = [be for be in BACKENDS if be != "symm_mem" or (cuda and backend == "nccl")]
    shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else COLLECTIVE_SHAPES)
    d = args.head_dim
    rows = []
    for b, h in shapes:
        if h % world:
            continue
        g = torch.Generator(device="cpu").manual_seed(rank)
        out = torch.randn((b, h, d), generator=g).to(torch.bfloat16).to(device)
        lse = (torch.randn((b, h), generator=g) * 4).to(device)
        res = {}
        for backend in backends:
            kw = {"backend": backend}
            if backend == "symm_mem":
                kw["buffers"] = SymmMemBuffers(group, max_tokens=b, num_heads=h, head_dim=d,
                                               dtype=out.dtype, device=device)
            res[backend] = _time_collective(lambda: lse_reduce(out, lse, group, **kw), device,
                                            args.iters)
        row = {"B": b, "H": h, "D": d, "N": world,
               **{f"{k}_us": v[0] for k, v in res.items()},
               **{f"{k}_timing": v[1] for k, v in res.items()},
               **{f"{k}_untimed_calls": v[2] for k, v in res.items()},
               **{f"{k}_over_packed": res[k][0] / res["packed"][0]
                  for k in backends if k != "packed"}}
        if "symm_mem" in res:
            row["symm_mem_speedup"] = res["packed"][0] / res["symm_mem"][0]
        rows.append(row)
    if rank == 0:
        import json

        with open(args.out, "w") as f:
            json.dump({"world_size": world, "device": str(device), "backends": backends,
                       "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                       "rows": rows}, f, indent=1)
        others = [be for be in backends if be != "packed"]
        print(f"{'B':>6} {'H':>4} " + " ".join(f"{be + ' us':>16}" for be in backends)
              + " " + " ".join(f"{be + '/packed':>20}" for be in others)
              + (f" {'symm speed-up':>13}" if "symm_mem" in backends else "") + " timing")
        for r in rows:
            print(f"{r['B']:6d} {r['H']:4d} "
                  + " ".join(f"{r[be + '_us']:16.1f}" for be in backends) + " "
                  + " ".join(f"{r[be + '_over_packed']:20.2f}" for be in others)
                  + (f" {r['symm_mem_speedup']:12.2f}x" if "symm_mem" in backends else "")
                  + f" {r['packed_timing']}")
    dist.destroy_process_group()
    return 0


CONSOLE_SCRIPT = "dcp-a2a-bench"  # pyproject.toml's [project.scripts] name for main()


def prog_name(argv0: str | None = None) -> str:
    """The command as the user ran it, for --help's usage line: the console script's name
    when run as ``dcp-a2a-bench`` (``dcp-a2a-bench.exe`` on Windows), else ``python -m``'s.
    ``argv0``: default ``sys.argv[0]``."""
    import ntpath  # splits at "/" and "\\" alike, whatever this machine's separator

    argv0 = sys.argv[0] if argv0 is None and sys.argv else (argv0 or "")
    name = ntpath.basename(argv0)
    if name == CONSOLE_SCRIPT or name.startswith(CONSOLE_SCRIPT + "."):
        return CONSOLE_SCRIPT
    return "python -m dcp_a2a.testing.bench"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog or prog_name(),
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="bench.json", help="JSON report (rank 0 with --collective)")
    ap.add_argument("--quick", action="store_true", help="only the two target shapes")
    ap.add_argument("--sweep", action="store_true", help="also time launch variants")
    ap.add_argument("--grid", action="store_true",
                    help="ours next to the straightforward design (dcp_a2a.testing."
                         "straightforward) and, for the unpack, the engine-design baseline "
                         "(dcp_a2a.testing.engine_design) over the decode grid, with the "
                         "ratios; --quick: a corner of it")
    ap.add_argument("--tables", default=None,
                    help="with --grid: comma list of launch tables to compare "
                         "(dcp_a2a.kernels.tuning.CANDIDATES; the first is reported)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="with --grid: interleaved timing rounds a point (medians reported)")
    ap.add_argument("--settle-rounds", type=int, default=9,
                    help="with --grid: rounds in all for an op whose verdict is undecided after "
                         "--rounds (no more rounds when not above --rounds)")
    ap.add_argument("--target", type=float, default=TARGET_RATIO,
                    help="with --grid: the verdict's bound on ours / straightforward")
    ap.add_argument("--collective", action="store_true",
                    help="under torchrun: time lse_reduce end to end per backend")
    ap.add_argument("--shapes", default=None, help="with --collective: BxH,BxH,... (D=--head-dim)")
    ap.add_argument("--head-dim", type=int, default=512,
                    help="with --collective: the head dim D of every shape")
    ap.add_argument("--eager-calls", type=int, default=eager.CALLS,
                    help="eager-call timing: back-to-back calls a repeat (one synchronise at "
                         "the end)")
    ap.add_argument("--eager-repeats", type=int, default=eager.REPEATS,
                    help="eager-call timing: repeats (the median is reported)")
    ap.add_argument("--iters", type=int, default=50,
                    help="with --collective: timed lse_reduce calls per backend and shape (the "
                         "median is reported)")
    return ap


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.eager_calls < 1 or args.eager_repeats < 1:
        parser.error("--eager-calls and --eager-repeats must be at least 1")
    if not args.target > 0:
        parser.error(f"--target must be positive, got {args.target}")
    from .outpaths import file_problem

    why = file_problem(args.out)
    if why:  # before minutes of timing, not after
        parser.error(f"--out {args.out}: {why}")
    if args.collective:
        return collective_main(args)
    if args.grid and torch.cuda.is_available():
        return grid_main(args)
    if not torch.cuda.is_available():
        print("dcp_a2a.testing.bench needs a CUDA GPU (the CPU path is the Triton interpreter, which "
              "says nothing about speed)", file=sys.stderr)
        return 2
    shapes = DEFAULT_SHAPES[:1] + DEFAULT_SHAPES[2:3] if args.quick else DEFAULT_SHAPES
    copy_gbps = copy_bandwidth()
    rows = []
    for b, h, d, n, dt in shapes:
        rows += bench_shape(b, h, d, n, dt, copy_gbps, sweep=args.sweep)
    props = torch.cuda.get_device_properties(0)
    import triton

    eager_rows = []
    for b, h, d, n, dt in shapes:
        if b * h <= EAGER_MAX_ROWS:  # decode sizes, where a call's host time is its time
            eager_rows += eager.eager_rows(b, h, d, n, dt, "cuda", args.eager_calls,
                                           args.eager_repeats)
    report = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__,
              "copy_gbps": copy_gbps, "rows": [asdict(r) for r in rows], "eager": eager_rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"device {props.name}; copy bandwidth {copy_gbps:.0f} GB/s (read + write)")
    print(table([r for r in rows if r.variant == "default"]))
    if eager_rows:
        print()
        print(eager.eager_table(eager_rows))
    if args.sweep:
        best = {}
        for r in rows:
            k = (r.shape, r.op)
            if r.variant != "default" and (k not in best or r.us < best[k].us):
                best[k] = r
        print("\nbest sweep variant per (shape, op):")
        print(table(list(best.values())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
