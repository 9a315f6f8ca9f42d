"""Our pack and unpack-combine against vLLM's own kernels, on one GPU, in one call: the targets
of "ahead of vLLM on every card", with a verdict per row.

    python benchmarks/benchmark_combine_vs_vllm.py ENGINE OUT [--rounds 7]
    python benchmarks/benchmark_combine_vs_vllm.py ENGINE OUT --smoke
        (tiny rows, the wall clock, the interpreter on a CPU: the structure only)

ENGINE is vLLM's release: its wheel (``pip download --no-deps vllm==0.34.0``), an unpacked
package tree, or its ``vllm/v1/attention/ops/dcp.py``. Only the definitions named in
``ENGINE_NAMES`` are read from it, by name (the rest of that file imports vLLM's engine), and
loaded as a module of their own; nothing of vLLM's is kept in this repository.

In one process, CUDA-graph replay, ``--rounds`` interleaved rounds
(``dcp_a2a.testing.timing.timed_rounds``) of ours, vLLM's wrapper (``_dcp_a2a_pack_send``,
``_dcp_a2a_unpack_combine``: allocation is free on replay) and a device copy of the same bytes:

* the 17 decode rows (``dcp_a2a.testing.tune.DECODE_ROWS``): per row and op the medians, the
  median per-round ratio ours / vLLM with its 95 % interval (``timing.ratio_verdict``), and a
  verdict: **met** (unpack <= 0.95 x, pack <= 0.8 x vLLM's kernel, by the interval), **floor**
  (not met, but ours already moves >= 90 % of what the copy of its bytes moves, by the
  interval: the row's bound), or **not met**;
* the large rows (B=8192 H=64 D=512 bf16 N=4 and 8): each op's share of the card's copy
  bandwidth (``bench.copy_bandwidth``, a 4 GiB device copy, bytes read + written), met at
  >= 93 % by the interval; vLLM's kernels timed beside them;
* B=1 H=128 D=512 N=8 bf16: pack + unpack, round by round, met at <= 2.5 us by the interval.

Before anything is timed, vLLM's pack must write our wire bit for bit and its unpack must agree
with ours within 2^-6. OUT is a result file (``docs/results/combine_vs_vllm/h100.json``) or a
folder, which gets the card's (``h100.json``): the JSON keeps every round's time, the launch
table in force, vLLM's release and the run (card, commit, date, command); the ``.md`` beside it
the tables, which print too. About 1.5 minutes on one H100 (estimated from the earlier side-by-side
runs: 23-36 s for the 17 unpack rows of three variants; here two ops and the large rows).
"""
from __future__ import annotations

import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, uninstalled
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside it

import dcp_a2a  # noqa: E402  (first: it picks Triton's interpreter on a machine without CUDA)
import torch  # noqa: E402
from dcp_a2a.kernels import tuning  # noqa: E402
from dcp_a2a.testing import bench, eager, tune, timing  # noqa: E402
from dcp_a2a.testing.adapters import _release  # noqa: E402

import _run  # noqa: E402

# vLLM's definitions read from its release, in the order they are defined
ENGINE_MEMBER = "vllm/v1/attention/ops/dcp.py"
ENGINE_NAMES = ("_validate_dcp_empty_shard_args", "_dcp_a2a_pack_send_kernel",
                "_dcp_a2a_unpack_combine_kernel", "_dcp_a2a_pack_send",
                "_dcp_a2a_unpack_combine")
_PRELUDE = ("from __future__ import annotations\n\nimport torch\nimport triton\n"
            "import triton.language as tl\n\n\n")
TARGETS = {"unpack": 0.95, "pack": 0.8}  # ours / vLLM's kernel at the decode rows
FLOOR_SHARE = 0.90  # of the copy of the row's bytes: the row's bound
COPY_SHARE = 0.93  # of the card's copy bandwidth, at the large rows
B1_US = 2.5  # pack + unpack at B=1 H=128 D=512 N=8 bf16
B1_ROW = (1, 128, 512, 8, "bfloat16")
SMOKE_DECODE = [(1, 4, 8, 2, "float16")]
SMOKE_COPY = [(2, 4, 8, 2, "bfloat16")]


def load_engine(path):
    """The module of ``ENGINE_NAMES`` read by name from vLLM's release ``path`` (a wheel, a
    package tree or its ``dcp.py``) through the engines' loader; ValueError naming what is
    missing."""
    return _release.load(path, [_release.Part(ENGINE_MEMBER, ENGINE_NAMES)],
                         prelude=_PRELUDE, tag="vllm_dcp_bench")


def release_version(path) -> str | None:
    """The wheel's version (its METADATA), else None."""
    return _release.Release(path).version()


def _median_ratio(a, b):
    return statistics.median(x / y for x, y in zip(a, b))


def _copy_of(nbytes, device):
    src = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def row_ops(engine, point, device):
    """{op: (variants {"ours", "vllm", "copy"}, bytes moved)} at ``point``, each checked first:
    vLLM's pack writes our wire bit for bit, its unpack agrees with ours within 2^-6."""
    b, h, d, n, dt = point
    p, hpr, out, lse, send, recv = eager.inputs(b, h, d, n, dt, device, seed=b * 7 + h + d)
    theirs = torch.full_like(send, float("nan"))
    engine._dcp_a2a_pack_send(out, lse, theirs, n, hpr, d, p)
    if not torch.equal(theirs.view(torch.uint8), send.view(torch.uint8)):
        raise AssertionError(f"vLLM's pack wrote another wire than ours at {point}")
    mine = dcp_a2a.unpack_combine(recv, d, p, False, True)
    other = engine._dcp_a2a_unpack_combine(recv, d, p, False, True)
    if not torch.allclose(other.float(), mine.float(), rtol=2 ** -6, atol=2 ** -6):
        raise AssertionError(f"vLLM's unpack differs from ours beyond 2^-6 at {point}")
    es = out.element_size()
    wire = send.numel() * es
    pack_bytes = out.numel() * es + lse.numel() * 4 + wire
    unpack_bytes = wire + b * hpr * d * es
    return {
        "pack": ({"ours": lambda: dcp_a2a.pack_send(out, lse, send, n, hpr, d, p),
                  "vllm": lambda: engine._dcp_a2a_pack_send(out, lse, theirs, n, hpr, d, p),
                  "copy": _copy_of(pack_bytes, device)}, pack_bytes),
        "unpack": ({"ours": lambda: dcp_a2a.unpack_combine(recv, d, p, False, True),
                    "vllm": lambda: engine._dcp_a2a_unpack_combine(recv, d, p, False, True),
                    "copy": _copy_of(unpack_bytes, device)}, unpack_bytes),
    }


def timed_row(engine, point, device, rounds, timer):
    """Every op's rounds at ``point``: {op: {"bytes", "timing", "median_us", "times_us"}}."""
    timed = {}
    for op, (variants, nbytes) in row_ops(engine, point, device).items():
        med, times, method = timing.timed_rounds(variants, nbytes, rounds, timer)
        timed[op] = {"bytes": nbytes, "timing": method, "median_us": med, "times_us": times}
    return timed


def decode_verdicts(point, timed) -> dict:
    b, h, d, n, dt = point
    row = {"B": b, "H": h, "D": d, "N": n, "dtype": dt}
    for op, t in timed.items():
        times = t["times_us"]
        lo, hi, target_verdict = timing.ratio_verdict(times["ours"], times["vllm"], TARGETS[op])
        flo, fhi, floor_verdict = timing.ratio_verdict(times["ours"], times["copy"],
                                                      1 / FLOOR_SHARE)
        verdict = ("met" if target_verdict == "met" else
                   "floor" if floor_verdict == "met" else "not met")
        row[op] = {**t, "target": TARGETS[op],
                   "ours_over_vllm": _median_ratio(times["ours"], times["vllm"]),
                   "interval": [lo, hi], "target_verdict": target_verdict,
                   "share_of_copy": _median_ratio(times["copy"], times["ours"]),
                   "ours_over_copy_interval": [flo, fhi], "verdict": verdict}
    return row


def copy_verdicts(point, timed, copy_gbps) -> dict:
    """The large rows: each op's share of the card's copy bandwidth, decided by the interval of
    ours over the time a copy at that bandwidth would take."""
    b, h, d, n, dt = point
    row = {"B": b, "H": h, "D": d, "N": n, "dtype": dt}
    for op, t in timed.items():
        times = t["times_us"]
        entry = {**t, "ours_over_vllm": _median_ratio(times["ours"], times["vllm"])}
        if copy_gbps:
            ideal = t["bytes"] / (copy_gbps * 1e3)  # us at the card's copy bandwidth
            lo, hi, verdict = timing.ratio_verdict(times["ours"], [ideal] * len(times["ours"]),
                                                  1 / COPY_SHARE)
            entry.update(share_of_card_copy=ideal / t["median_us"]["ours"],
                         share_interval=[1 / hi, 1 / lo], verdict=verdict)
        else:
            entry.update(share_of_card_copy=None, share_interval=None, verdict="not timed")
        row[op] = entry
    return row


def b1_verdict(row) -> dict:
    sums = [a + b for a, b in zip(row["pack"]["times_us"]["ours"],
                                  row["unpack"]["times_us"]["ours"])]
    lo, hi, verdict = timing.ratio_verdict(sums, [B1_US] * len(sums), 1.0)
    return {"row": [row[k] for k in ("B", "H", "D", "N", "dtype")],
            "pack_us": row["pack"]["median_us"]["ours"],
            "unpack_us": row["unpack"]["median_us"]["ours"],
            "sum_us": statistics.median(sums), "interval_us": [lo * B1_US, hi * B1_US],
            "target_us": B1_US, "verdict": verdict}


def card_stem(name: str) -> str:
    """A result file's name for a card (``results.py``'s: cpu, h100, h200...): the first word
    of letters then digits in the device's name, else its last letters and digits run
    together."""
    if not name or name.startswith("CPU"):
        return "cpu"
    words = name.replace("NVIDIA", "").replace("-", " ").split()
    found = next((w for w in words if re.fullmatch(r"[A-Za-z]+\d+", w)), None)
    if found is None:
        found = "".join(w for w in words if w.isalnum())[-12:]
    return found.lower()


def _iv(iv, fmt="{:.3f}"):
    return "-" if not iv or iv[0] != iv[0] else f"[{fmt.format(iv[0])}, {fmt.format(iv[1])}]"


def markdown(report) -> str:
    """The tables (the run's header comes from ``_run``)."""
    lines = [f"vLLM {report['vllm']['version'] or '?'} ({report['vllm']['source']}); launch "
             f"table {report['launch_table']}; copy "
             + (f"{report['copy_gbps']:.0f} GB/s (read + write)" if report["copy_gbps"]
                else "not measured") + f"; {report['rounds']} interleaved rounds of CUDA-graph "
             f"replay{' (smoke: wall clock, the structure only)' if report['smoke'] else ''}; "
             f"{report['seconds']:.0f} s.", "",
             "Decode rows: ours / vLLM's kernel, median of the per-round ratios [95 % interval]; "
             f"met: unpack <= {TARGETS['unpack']}, pack <= {TARGETS['pack']} by the interval; "
             f"floor: not met, but ours moves >= {FLOOR_SHARE:.0%} of what a copy of its bytes "
             "moves (% copy: the copy's time over ours).", "",
             "| B | H | D | N | dtype | unpack us | vLLM us | ours/vLLM | verdict | % copy "
             "| pack us | vLLM us | ours/vLLM | verdict | % copy |",
             "|--:|--:|--:|--:|---|--:|--:|---|---|--:|--:|--:|---|---|--:|"]
    for r in report["decode"]:
        cells = [str(r[k]) for k in ("B", "H", "D", "N", "dtype")]
        for op in ("unpack", "pack"):
            o = r[op]
            cells += [f"{o['median_us']['ours']:.2f}", f"{o['median_us']['vllm']:.2f}",
                      f"{o['ours_over_vllm']:.3f} {_iv(o['interval'])}",
                      f"**{o['verdict']}**" if o["verdict"] != "met" else "met",
                      f"{100 * o['share_of_copy']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    counts = {op: {v: sum(r[op]["verdict"] == v for r in report["decode"])
                   for v in ("met", "floor", "not met")} for op in ("unpack", "pack")}
    lines += ["", "; ".join(f"{op}: " + ", ".join(f"{n} {v}" for v, n in c_.items())
                            for op, c_ in counts.items()), "",
              f"Large rows: share of the card's copy bandwidth (met at >= {COPY_SHARE:.0%} by "
              "the interval), ours / vLLM's kernel beside it.", "",
              "| B | H | D | N | dtype | op | ours us | share of copy | verdict | ours/vLLM |",
              "|--:|--:|--:|--:|---|---|--:|---|---|--:|"]
    for r in report["large"]:
        for op in ("pack", "unpack"):
            o = r[op]
            share = ("-" if o["share_of_card_copy"] is None else
                     f"{100 * o['share_of_card_copy']:.1f} % {_iv(o['share_interval'], '{:.1%}')}")
            lines.append(f"| {r['B']} | {r['H']} | {r['D']} | {r['N']} | {r['dtype']} | {op} | "
                         f"{o['median_us']['ours']:.1f} | {share} | {o['verdict']} | "
                         f"{o['ours_over_vllm']:.3f} |")
    b1 = report["b1"]
    if b1:
        lines += ["", f"B=1 ({' '.join(map(str, b1['row']))}): pack + unpack "
                      f"{b1['pack_us']:.2f} + {b1['unpack_us']:.2f} us, per round "
                      f"{b1['sum_us']:.2f} us {_iv(b1['interval_us'], '{:.2f}')} "
                      f"(target <= {b1['target_us']} us): {b1['verdict']}."]
    return "\n".join(lines) + "\n"


def parser():
    ap = _run.parser(__doc__, "benchmark_combine_vs_vllm.py")
    ap.add_argument("engine", help="vLLM's release: its wheel, package tree or dcp.py")
    ap.add_argument("out", metavar="OUT", type=Path,
                    help="result file (.json; the tables go to .md beside it) or a folder, "
                         "which gets the card's (h100.json)")
    ap.add_argument("--rounds", type=_run.positive_int, default=7,
                    help="interleaved rounds (2 at least)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny rows, wall clock: the structure only (on the GPU where there is "
                         "one, else the CPU through Triton's interpreter)")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error(f"--rounds must be at least 2 (an interval needs two), got {args.rounds}")
    if args.smoke:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        decode_rows, large_rows, timer, rounds = SMOKE_DECODE, SMOKE_COPY, tune.wall_timer, 2
    elif not torch.cuda.is_available():
        print("benchmark_combine_vs_vllm.py needs a CUDA GPU (--smoke: the CPU structure "
              "check)", file=sys.stderr)
        return 2
    else:
        device, decode_rows, large_rows = "cuda", tune.DECODE_ROWS, tune.COPY_ROWS
        timer, rounds = None, args.rounds
    run = _run.provenance()
    out = args.out if args.out.suffix == ".json" else args.out / f"{card_stem(run['card'])}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    engine = load_engine(args.engine)
    t0 = time.time()
    copy_gbps = bench.copy_bandwidth() if device == "cuda" and not args.smoke else None
    decode = []
    for point in decode_rows:
        decode.append(decode_verdicts(point, timed_row(engine, point, device, rounds, timer)))
        r = decode[-1]
        print(f"  {point}: unpack {r['unpack']['ours_over_vllm']:.3f} ({r['unpack']['verdict']})"
              f", pack {r['pack']['ours_over_vllm']:.3f} ({r['pack']['verdict']}) "
              f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    large = [copy_verdicts(point, timed_row(engine, point, device, rounds, timer), copy_gbps)
             for point in large_rows]
    first = decode[0] if args.smoke else next(
        r for r in decode if (r["B"], r["H"], r["D"], r["N"], r["dtype"]) == B1_ROW)
    table, why = tuning.table_in_force()
    report = {"cuda": torch.version.cuda, "smoke": args.smoke, "rounds": rounds,
              "vllm": {"source": str(args.engine), "version": release_version(args.engine)},
              "launch_table": why, "copy_gbps": copy_gbps, "seconds": time.time() - t0,
              "decode": decode, "large": large, "b1": b1_verdict(first), "run": run}
    out.write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    out.with_suffix(".md").write_text(_run.header("combine_vs_vllm", run) + "\n" + text)
    print(text)
    print(f"{out}, {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
