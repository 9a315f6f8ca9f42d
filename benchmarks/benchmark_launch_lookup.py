"""Host cost of choosing a kernel launch (``dcp_a2a.kernels.tuning.launch``) on an eager call:
nanoseconds a call once the problem's launch is known (the path every repeated decode call
takes), with the compiled launch table in force. CPU only: no kernel runs.

    python benchmarks/benchmark_launch_lookup.py [--calls 200000] [--repeats 7]

Prints, per call site (``launch``, ``pack_launch``, ``combine_launch``), the median over
``--repeats`` of ``--calls`` back-to-back calls (the sites interleaved), and the fastest
repeat. On a shared machine compare the fastest repeats of runs made one after the other.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, uninstalled

from dcp_a2a.kernels import tuning  # noqa: E402

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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        ap.error("--calls and --repeats must be at least 1")
    saved = tuning._env
    tuning._env = types.SimpleNamespace(INTERPRET=False)  # the GPU's (compiled) table
    try:
        for name, runs in ns_per_call(CALLS, args.calls, args.repeats).items():
            print(f"{name:15} {statistics.median(runs):7.1f} ns a call (median of "
                  f"{args.repeats}; best {min(runs):.1f})")
    finally:
        tuning._env = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
