"""Host cost of choosing a kernel launch (``dcp_a2a.kernels.tuning.launch``) on an eager call:
nanoseconds a call once the problem's launch is known (the path every repeated decode call
takes), with the compiled launch table in force. CPU only: no kernel runs.

    python benchmarks/benchmark_launch_lookup.py [OUT.json] [--calls 200000] [--repeats 7]

Prints, per call site (``launch``, ``pack_launch``, ``combine_launch``), the median over
``--repeats`` of ``--calls`` back-to-back calls (the sites interleaved), and the fastest
repeat. On a shared machine compare the fastest repeats of runs made one after the other.
"""
from __future__ import annotations

import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, uninstalled
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside it

from dcp_a2a.kernels import tuning  # noqa: E402

import _run  # noqa: E402

CALLS = {  # the decode rows' launches: B=64 H=128 D=512 bf16 N=8
    "launch": lambda: tuning.launch("combine", 64, 16, 256, 8),
    "pack_launch": lambda: tuning.pack_launch(64, 128, 256, 8, False),
    "combine_launch": lambda: tuning.combine_launch(8, 64, 16, 256),
}


def ns_per_call(fns: dict, calls: int, repeats: int) -> dict:
    """{name: every repeat's ns a call}, the names interleaved in each repeat (a machine that
    slows down meanwhile slows them all)."""
    for fn in fns.values():
        fn()  # the first call chooses the launch; the rest look it up
    runs = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            runs[name].append((time.perf_counter_ns() - t0) / calls)
    return runs


def main(argv=None) -> int:
    ap = _run.parser(__doc__, "benchmark_launch_lookup.py")
    _run.add_out(ap, required=False)
    ap.add_argument("--calls", type=_run.positive_int, default=200_000,
                    help="back-to-back calls a repeat")
    ap.add_argument("--repeats", type=_run.positive_int, default=7, help="repeats a site")
    args = ap.parse_args(argv)
    saved = tuning._env
    tuning._env = types.SimpleNamespace(INTERPRET=False)  # the GPU's (compiled) table
    try:
        with _run.recorded(args.out, "launch_lookup") as save:
            runs = ns_per_call(CALLS, args.calls, args.repeats)
            save({"calls": args.calls, "repeats": args.repeats,
                  "rows": [{"site": k, "ns": statistics.median(v), "best_ns": min(v),
                            "runs_ns": v} for k, v in runs.items()]})
            for name, v in runs.items():
                print(f"{name:15} {statistics.median(v):7.1f} ns a call (median of "
                      f"{args.repeats}; best {min(v):.1f})")
    finally:
        tuning._env = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
