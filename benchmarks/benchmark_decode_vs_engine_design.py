"""Our unpack-combine at the decode rows against the engine-design baseline, with candidate
launches and instruction variants beside it, and eager calls against their floors: what a pass
over the combine's kernel measures before the table or the kernel changes.

    python benchmarks/benchmark_decode_vs_engine_design.py OUT.json [--rounds 7] [--budget 420]
    python benchmarks/benchmark_decode_vs_engine_design.py OUT.json --smoke
        (tiny shapes: structure only)
    python benchmarks/benchmark_decode_vs_engine_design.py OUT.json --from-grid GRID.json \
        --rounds 3
        (part 1 only, at a grid's points slower than the engine design, worst first)
    python benchmarks/benchmark_decode_vs_engine_design.py OUT.json --from-grid GRID.json \
        --changed-from combine_seventeenth_pass [--skip K]
        (part 1 only, at every grid point whose combine launch the named table of
        tuning.CANDIDATES chose otherwise: ours, the engine design, the straightforward kernel
        and that table's launch, "was"; no other candidates)

1. Graph replay, at the 17 decode rows (B, H, D, N, dtype; ``dcp_a2a.testing.tune.DECODE_ROWS``):
   our unpack-combine next to the engine-design baseline
   (:mod:`dcp_a2a.testing.engine_design`, the design of vLLM's kernel), the straightforward
   kernel, and candidate launches of our own kernel for the decode band (bench variants only;
   ``dcp-a2a tune`` derives a card's table from such candidates): one (token, local head) a
   program, the whole head in one tile, 1, 2, 4 or 8 warps (those the table does not already
   give), two heads a program at 1, 2 or 4 warps ("h2_w*", where the table gives one), a
   head's lanes split over 2 programs at 1, 2 or 4 warps or over 4 at 1 or 2 ("d2_w*",
   "d4_w*": fewer registers a program; where each gets 32 lanes or more), one head a program
   on a head-major grid at 1, 2 or 4 warps ("hm_w*": the programs dispatched one after another
   read one token's heads, consecutive wire rows), the table's launch with the 16-bit lanes
   moved one by one instead of paired into words ("elements"), with the other bf16 rounding
   ("int_cvt": the integer one where the table's launch rounds natively; "native_cvt" where
   it does not), and with multiply-add contraction allowed ("fma": what bitwise determinism
   costs; not a candidate, compared within 2^-6). Every candidate's output is checked bit for
   bit against ours and the baselines' within 2^-6 before anything is timed. ``--rounds``
   interleaved rounds of CUDA-graph replays (``dcp_a2a.testing.bench.timed_rounds``), then per
   row the median of the per-round ratios ours / engine, its 95 % interval and verdict at 1.0
   (``bench.ratio_verdict``), and each candidate's median per-round ratio over the engine.
2. Eager calls (:mod:`dcp_a2a.testing.eager`, 1000 back-to-back calls synchronised at the end,
   median of 5): ours, the engine-design wrapper, the empty-kernel floors, lse_reduce (packed,
   a group of one), at two decode rows.

OUT.json keeps every round's time (and the run: card, commit, date, command); the short tables
print last and go to OUT.md. Rows past ``--budget`` seconds of part 1 are skipped (and listed),
so part 2 always runs: about 50 ms a graph timing, 8-9 variants x 7 rounds a row, plus the
compiles: the whole run took 79-91 s on an H100 (2026-12-06); --from-grid about 3.5 s a point.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, uninstalled
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside it

import dcp_a2a  # noqa: E402  (first: it picks Triton's interpreter on a machine without CUDA)
import torch  # noqa: E402

from dcp_a2a import ops  # noqa: E402
from dcp_a2a.kernels import combine, tuning  # noqa: E402
from dcp_a2a.testing import bench, eager, engine_design, tune  # noqa: E402
from dcp_a2a.testing import straightforward as sf  # noqa: E402

import _run  # noqa: E402

ROWS = tune.DECODE_ROWS  # (B, H, D, N, dtype)
# the vLLM column the decode rows were first reported with (us, vLLM main's kernel, CUDA-graph
# replay on one H200), row for row: the engine-design baseline should reproduce it within 5 %
REPORTED_VLLM_US = dict(zip(map(tuple, ROWS), (
    2.29, 2.62, 2.88, 3.77, 5.81, 11.00, 27.01, 2.44, 3.52, 1.67, 1.69, 1.71, 3.01, 2.91, 3.02,
    1.74, 2.09)))
EAGER_ROWS = [(64, 128, 512, 8, "bfloat16"), (256, 32, 128, 4, "float16")]
SMOKE_ROWS = [(2, 4, 8, 2, "float16")]
WARPS = (1, 2, 4, 8)


def wire(b, h, d, n, dtype_name, device):
    """(P, recv[N, B, H/N, D+P], bytes an unpack moves): a packed wire of random partials."""
    p, hpr, out, _, recv, _ = eager.inputs(b, h, d, n, dtype_name, device, seed=b * 7 + h + d)
    es = out.element_size()
    return p, recv, recv.numel() * es + b * hpr * d * es


def with_launch(cfg, fn):
    """``fn`` under a combine launch override (``tuning.OVERRIDES``)."""
    def run():
        tuning.OVERRIDES["combine"] = cfg
        try:
            return fn()
        finally:
            tuning.OVERRIDES.pop("combine", None)
    return run


def patched(fn, name, value, cfg=None):
    """``fn`` with ``combine.<name>`` set to ``value``, under the launch override ``cfg`` if
    given (a new Launch object: the launch plan is built again, not reused). No problem is kept
    meanwhile (a kept one would launch what it kept before the patch)."""
    def run():
        saved = getattr(combine, name)
        setattr(combine, name, value)
        ops.forget_calls()
        try:
            return (with_launch(cfg, fn) if cfg is not None else fn)()
        finally:
            setattr(combine, name, saved)
            ops.forget_calls()
    return run


def unpaired(fn):
    """``fn`` with 16-bit lanes moved one by one (the launcher finds no word view)."""
    return patched(fn, "as_words", lambda t: None)


def word_lanes(d, dtype_name):
    """The lanes the combine moves a row: 32-bit words of two 16-bit values where D is even."""
    return d // 2 if dcp_a2a.lse_pack_dim(getattr(torch, dtype_name)) == 2 and d % 2 == 0 else d


def variants_at(b, h, d, n, dtype_name, device, fma=True, was=None, only=None):
    """({name: zero-argument unpack}, bytes moved), each checked first: candidates bit for bit
    against ours, the baselines within 2^-6; ``fma=False`` leaves out the contraction run.
    ``was``: a launch (another table's) timed as the only candidate. ``only``: name
    prefixes; the candidates kept (the baselines always are)."""
    p, recv, nbytes = wire(b, h, d, n, dtype_name, device)
    hpr = h // n
    ours = lambda: dcp_a2a.unpack_combine(recv, d, p, False, True)  # noqa: E731
    v = {"ours": ours, "engine": lambda: engine_design.unpack_combine(recv, d),
         "sf": lambda: sf.unpack_combine(recv, d)}
    if was is not None:
        v["was"] = with_launch(was, ours)
        return _checked(v, ours, b, h, d, n, dtype_name), nbytes
    lanes = word_lanes(d, dtype_name)
    table = tuning.combine_launch(n, b, hpr, lanes)
    for w in WARPS:  # one (token, head) a program, the head in one tile
        cfg = tuning.Launch(1, 1 << 30, w)  # block_d: capped at the head's power of two
        if (table.block_h, table.num_warps) != (1, w) or table.block_d < lanes:
            v[f"head_w{w}"] = with_launch(cfg, ours)
    for w in WARPS[:3]:  # one head a program on a head-major grid: programs dispatched one
        # after another read one token's heads (consecutive wire rows), not one head's tokens
        v[f"hm_w{w}"] = with_launch(tuning.Launch(1, 1 << 30, w, head_major=True), ours)
    for heads in (2, 4):  # several heads a program: fewer programs (4: heads <= 128 lanes)
        if table.block_h != heads and hpr >= heads and (heads == 2 or lanes <= 128):
            for w in (1, 2, 4):
                v[f"h{heads}_w{w}"] = with_launch(tuning.Launch(heads, 1 << 30, w), ours)
    for split, warps in ((2, (1, 2, 4)), (4, (1, 2))):  # a head's lanes over several programs
        if lanes // split >= 32:
            for w in warps:
                v[f"d{split}_w{w}"] = with_launch(tuning.Launch(1, 0, w, split_d=split), ours)
    if lanes != d:
        v["elements"] = unpaired(ours)
    same = dataclasses.replace(table)  # the table's launch, a new object (plans built again)
    dtype = getattr(torch, dtype_name)
    if combine.native_bf16(dtype, table.num_warps):  # the other bf16 rounding, at this launch
        v["int_cvt"] = patched(ours, "USE_NATIVE_BF16", False, same)
    elif combine.native_bf16(dtype):
        v["native_cvt"] = patched(ours, "NATIVE_BF16_MAX_WARPS", 1 << 10, same)
    # what bitwise determinism costs: the same launch with multiply-add contraction allowed
    # (not a candidate: packed and two_collective could then differ in the last bit)
    if fma:
        v["fma"] = patched(ours, "NO_CONTRACTION", {"enable_fp_fusion": True}, same)
    if only:
        v = {k: f for k, f in v.items()
             if k in ("ours", "engine", "sf") or k.startswith(tuple(only))}
    return _checked(v, ours, b, h, d, n, dtype_name), nbytes


def _checked(v, ours, b, h, d, n, dtype_name):
    """``v`` once each variant's output matched ours (bit for bit; the baselines and the
    contraction run within 2^-6)."""
    ref = ours()
    for name, fn in v.items():
        got = fn()
        if name in ("engine", "sf", "fma"):
            ok = torch.allclose(got.float(), ref.float(), rtol=2 ** -6, atol=2 ** -6)
        else:
            ok = torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
        if not ok:
            raise AssertionError(f"{name} differs from ours at B={b} H={h} D={d} N={n} "
                                 f"{dtype_name}")
    return v


def wall_timer(fn, nbytes):
    """The smoke run's stand-in for ``bench.time_us`` (no CUDA graphs on a CPU)."""
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6, "wall"


def graph_row(point, device, rounds, timer, fma=True, was=None, only=None):
    b, h, d, n, dt = point
    v, nbytes = variants_at(b, h, d, n, dt, device, fma, was, only)
    med, times, method = bench.timed_rounds(v, nbytes, rounds, timer)

    def per_round(a, e):
        return statistics.median(x / y for x, y in zip(times[a], times[e]))

    lo, hi, verdict = bench.ratio_verdict(times["ours"], times["engine"], bench.ENGINE_TARGET)
    cands = {k: per_round(k, "engine") for k in v if k not in ("ours", "engine", "sf")}
    vllm = REPORTED_VLLM_US.get(tuple(point))
    return {"B": b, "H": h, "D": d, "N": n, "dtype": dt, "bytes": nbytes, "timing": method,
            "rounds": rounds, "median_us": med, "times_us": times,
            "ours_over_engine": per_round("ours", "engine"), "ci": [lo, hi], "verdict": verdict,
            "sf_over_engine": per_round("sf", "engine"),
            "engine_over_reported_vllm": med["engine"] / vllm if vllm else None,
            "candidates_over_engine": cands,
            "candidates_over_ours": {k: per_round(k, "ours") for k in cands}}


def graph_table(rows):
    head = (f"{'B':>4} {'H':>4} {'D':>4} {'N':>2} {'dtype':<8} {'ours us':>8} {'eng us':>8} "
            f"{'ours/eng':>8} {'95% interval':>15} {'v':>4} {'sf/eng':>7} {'eng/vllm':>8}  "
            "best candidate /eng")
    lines = [head, "-" * len(head)]
    for r in rows:
        best = min(((k, x) for k, x in r["candidates_over_engine"].items() if k != "fma"),
                   key=lambda kv: kv[1], default=None)
        lo, hi = r["ci"]
        lines.append(
            f"{r['B']:>4} {r['H']:>4} {r['D']:>4} {r['N']:>2} {r['dtype']:<8} "
            f"{r['median_us']['ours']:8.2f} {r['median_us']['engine']:8.2f} "
            f"{r['ours_over_engine']:8.3f} [{lo:6.3f},{hi:6.3f}] "
            f"{bench._MARK[r['verdict']]:>4} {r['sf_over_engine']:7.3f} "
            + (f"{r['engine_over_reported_vllm']:8.3f}  " if r.get("engine_over_reported_vllm")
               else f"{'-':>8}  ")
            + (f"{best[0]} {best[1]:.3f}" if best else "-"))
    lines.append(f"ratios: medians of the per-round ratios over {rows[0]['rounds']} interleaved "
                 f"rounds ({rows[0]['timing']}); v: ours <= {bench.ENGINE_TARGET} x the engine "
                 "design (ok met, ? undecided, MISS missed); eng/vllm: the baseline's median "
                 "over the reported vLLM figure (one H200: within 0.95-1.05 asked)")
    return "\n".join(lines)


def grid_misses(path, min_ratio):
    """(B, H, D, N, dtype) of a grid's points not met against the engine design at or above
    ``min_ratio``, worst first."""
    with open(path) as f:
        points = json.load(f)["grid"]
    worst = sorted((p for p in points if p["unpack_engine_verdict"] != "met"
                    and p["unpack_engine_ratio"] >= min_ratio),
                   key=lambda p: -p["unpack_engine_ratio"])
    return [(p["B"], p["H"], p["D"], p["N"], p["dtype"]) for p in worst]


def grid_changed(path, table_name):
    """[((B, H, D, N, dtype), launch)]: a grid's points whose combine launch under
    ``tuning.CANDIDATES[table_name]`` differs from the table in force, with that launch; the
    points slowest against the engine design in the grid first."""
    with open(path) as f:
        points = json.load(f)["grid"]
    changed = []
    for p in sorted(points, key=lambda p: -p["unpack_engine_ratio"]):
        b, h, d, n, dt = p["B"], p["H"], p["D"], p["N"], p["dtype"]
        problem = (n, b, h // n, word_lanes(d, dt))
        now = tuning.combine_launch(*problem)
        saved, tuning.ACTIVE = tuning.ACTIVE, tuning.CANDIDATES[table_name]
        try:
            was = tuning.combine_launch(*problem)
        finally:
            tuning.ACTIVE = saved
        if was != now:
            changed.append(((b, h, d, n, dt), was))
    return changed


def run_settings(smoke, rounds, script):
    """(device, rows, eager rows, timer, rounds, calls, repeats) of a run: ``smoke``: the tiny
    shapes, the wall clock, where the suite runs the kernels (the GPU if any, the interpreter
    otherwise); else the decode rows on the GPU (None, said on stderr, without one)."""
    if smoke:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return device, SMOKE_ROWS, SMOKE_ROWS[:1], wall_timer, 2, 1, 2
    if not torch.cuda.is_available():
        print(f"{script} needs a CUDA GPU (--smoke: the CPU structure check)", file=sys.stderr)
        return None
    return "cuda", ROWS, EAGER_ROWS, None, rounds, eager.CALLS, eager.REPEATS


def main(argv=None) -> int:
    ap = _run.parser(__doc__, "benchmark_decode_vs_engine_design.py")
    _run.add_out(ap)
    ap.add_argument("--rounds", type=_run.positive_int, default=7,
                    help="interleaved rounds a row")
    ap.add_argument("--budget", type=_run.positive_float, default=420.0,
                    help="seconds for part 1 (graph replay); rows past it are skipped")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, wall-clock timer: structure only (on the GPU where there "
                         "is one, else the CPU through Triton's interpreter)")
    ap.add_argument("--from-grid", metavar="GRID_JSON",
                    help="instead of the decode rows: the grid's points (bench --grid JSON) "
                         "where ours took at least --min-ratio x the engine design's time and "
                         "its verdict was not met, worst first; no eager part, no fma run")
    ap.add_argument("--min-ratio", type=float, default=1.0, help="with --from-grid")
    ap.add_argument("--changed-from", metavar="TABLE",
                    help="with --from-grid: instead of its misses, every point whose combine "
                         "launch TABLE (a name in tuning.CANDIDATES) chose otherwise, timed "
                         "beside that launch ('was')")
    ap.add_argument("--skip", type=int, default=0, metavar="K",
                    help="leave out the first K rows (a second call going on where the first "
                         "one's --budget stopped: K = the rows its JSON timed)")
    ap.add_argument("--only", metavar="PREFIXES",
                    help="comma-separated name prefixes: time only these candidates (e.g. "
                         "'d' for the split heads) beside ours and the baselines")
    args = ap.parse_args(argv)
    only = args.only.split(",") if args.only else None
    t0 = time.time()
    run = run_settings(args.smoke, args.rounds, "benchmark_decode_vs_engine_design.py")
    if run is None:
        return 2
    device, rows, eager_rows_at, timer, rounds, calls, repeats = run
    was = {}
    if args.from_grid and args.changed_from:
        was = dict(grid_changed(args.from_grid, args.changed_from))
        rows, eager_rows_at = list(was), []
    elif args.from_grid:
        rows, eager_rows_at = grid_misses(args.from_grid, args.min_ratio), []
    if args.skip < 0:
        ap.error("--skip takes a count of rows, 0 or more")
    rows = rows[args.skip:]
    graph, skipped = [], []
    for point in rows:
        if time.time() - t0 > args.budget:
            skipped.append(point)
            continue
        graph.append(graph_row(point, device, rounds, timer, fma=not args.from_grid,
                               was=was.get(point), only=only))
        print(f"  graph {point}: ours/engine {graph[-1]['ours_over_engine']:.3f} "
              f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    eager_rows = []
    for point in eager_rows_at:
        eager_rows += eager.eager_rows(*point, device, calls, repeats)
    import triton

    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "smoke": args.smoke,
              "seconds": time.time() - t0, "graph": graph, "skipped": skipped,
              "eager": eager_rows}
    with _run.recorded(args.out, "decode_vs_engine_design") as save:
        save(report)
        print(f"device {report['device']}, torch {torch.__version__}, triton "
              f"{triton.__version__}, {report['seconds']:.0f} s; {args.out}")
        if skipped:
            print(f"skipped past --budget: {skipped}")
        print(graph_table(graph) if graph else "no graph rows")
        if eager_rows:
            print()
            print(eager.eager_table(eager_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
