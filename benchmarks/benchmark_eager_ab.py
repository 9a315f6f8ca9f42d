"""Eager calls of two checkouts side by side, on one GPU machine, in alternating rounds.

    python benchmarks/benchmark_eager_ab.py BEFORE_CHECKOUT [OUT.json] [--rounds 3]
    python benchmarks/benchmark_eager_ab.py BEFORE_CHECKOUT --smoke   (CPU, interpreter, tiny
        shapes, 2 calls: the structure only; the times mean nothing)

Each round runs :func:`dcp_a2a.testing.eager.eager_rows` (1000 back-to-back calls synchronised
at the end, median of 5) at three decode rows in a fresh process per checkout, the
checkout before first, then this one (the directory holding ``benchmarks/``), so that both see the
same machine state in turn. Per op and row it prints the median over rounds of each checkout's
us per call and the median of the per-round ratios after / before. The JSON keeps every
round's rows. The checkout before is any directory holding a ``dcp_a2a`` package with the same
``eager_rows`` (``git archive REV | tar -x -C DIR`` makes one).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import _run

HERE = _run.ROOT
ROWS = [(1, 128, 512, 8, "bfloat16"), (64, 128, 512, 8, "bfloat16"),
        (256, 32, 128, 4, "float16")]  # decode rows: the smallest, a mid one, a 128-lane head
SMOKE_ROWS = [(2, 4, 8, 2, "float16")]
_CHILD = """
import json, sys
import dcp_a2a
from dcp_a2a.testing import eager
rows = []
device, calls, repeats = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for b, h, d, n, dt in json.loads(sys.argv[1]):
    rows += eager.eager_rows(b, h, d, n, dt, device, calls, repeats)
print(json.dumps({"package": dcp_a2a.__file__, "rows": rows}))
"""


def run_checkout(tree: Path, rows, device: str, calls: int, repeats: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    res = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(rows), device, str(calls),
                          str(repeats)], env=env, cwd=tree, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"{tree}: the eager rows failed:\n{res.stderr[-3000:]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    if not Path(got["package"]).resolve().is_relative_to(tree):
        raise SystemExit(f"{tree}: the child imported dcp_a2a from {got['package']}")
    return got["rows"]


def main(argv=None) -> int:
    ap = _run.parser(__doc__, "benchmark_eager_ab.py")
    ap.add_argument("before", type=Path, help="the checkout to compare against")
    _run.add_out(ap, required=False)
    ap.add_argument("--rounds", type=_run.positive_int, default=3)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, 2 calls")
    args = ap.parse_args(argv)
    if not (args.before / "dcp_a2a").is_dir():
        ap.error(f"{args.before} holds no dcp_a2a package")
    rows, device, calls, repeats = ((SMOKE_ROWS, "cpu", 2, 1) if args.smoke
                                    else (ROWS, "cuda", 1000, 5))
    with _run.recorded(args.out, "eager_ab") as save:
        return compare(args, rows, device, calls, repeats, save)


def compare(args, rows, device, calls, repeats, save) -> int:
    trees = {"before": args.before.resolve(), "after": HERE}
    rounds = []
    for i in range(args.rounds):
        rounds.append({side: run_checkout(tree, rows, device, calls, repeats)
                       for side, tree in trees.items()})
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    table = {}
    for rnd in rounds:
        for side, rows in rnd.items():
            for r in rows:
                table.setdefault((r["shape"], r["op"]), {}).setdefault(side, []).append(r["us"])
    lines = [f"{'shape':32} {'op':20} {'before us':>10} {'after us':>10} {'after/before':>13}"]
    summary = []
    for (shape, op), sides in table.items():
        if set(sides) != {"before", "after"}:
            continue
        ratios = [a / b for a, b in zip(sides["after"], sides["before"])]
        row = {"shape": shape, "op": op, "before_us": statistics.median(sides["before"]),
               "after_us": statistics.median(sides["after"]),
               "ratio": statistics.median(ratios), "ratios": ratios}
        summary.append(row)
        lines.append(f"{shape:32} {op:20} {row['before_us']:10.2f} {row['after_us']:10.2f} "
                     f"{row['ratio']:13.3f}")
    lines.append(f"medians over {args.rounds} alternating rounds (a fresh process per checkout "
                 "and round); ratio: the median of the per-round ratios")
    import torch
    save({"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
          "torch": torch.__version__, "before": str(args.before), "rows": rows,
          "rounds": rounds, "summary": summary})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
