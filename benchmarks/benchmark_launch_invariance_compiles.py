"""How many kernels the launch-invariance grid compiles on a GPU, per kernel. Needs no GPU.

gpu-check's time on a GPU is mostly Triton compiling (docs/validate.md), and each distinct
specialisation of a kernel is one compile. This runs the GPU grid of
tests/kernel/test_launch_invariance.py: its shapes, groups, dtypes, LSE bases and every launch
of every table, through every backend. It runs under Triton's interpreter with each kernel
launch recorded and not run. Distinct launches are counted by the key Triton compiles by:
- the constexprs and the launch options;
- each tensor argument's element type and 16-byte alignment;
- each integer's class (1, a multiple of 16, other; 64-bit or not), unless the kernel leaves
  it unspecialised; a bool's or a float's type alone (Triton compiles one kernel for either
  value of a bool).

    python benchmarks/benchmark_launch_invariance_compiles.py [OUT.json] [--shapes ...] [--groups 2,4,8]

The default shapes are the grid's less its 8192-row one, whose partials would take gigabytes
here; its specialisations differ from the 128-row shape's only where its heads per rank do.
About a minute on 2 cores. The table: kernel, specialisations, and how many of them each LSE
base, group size and dtype adds.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import inspect
import itertools
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before dcp_a2a's kernels are made
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _run, beside it

import torch  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from dcp_a2a.kernels import tuning  # noqa: E402
from dcp_a2a.testing.accuracy_cases import GPU_SHAPES, parse_shapes, rank_partial  # noqa: E402

import _run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SHAPES = ",".join(s for s in GPU_SHAPES.split(",") if not s.startswith("8192x"))


def _grid_module():
    """tests/kernel/test_launch_invariance.py: the grid is the test's own, never a copy."""
    path = ROOT / "tests" / "kernel" / "test_launch_invariance.py"
    spec = importlib.util.spec_from_file_location("launch_invariance_grid", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _int_class(value: int):
    return ("1" if value == 1 else "16k" if value % 16 == 0 else "int", abs(value) >= 2 ** 31)


def specialisation(kernel, args, kwargs):
    """(kernel name, key) of one launch, as Triton tells specialisations apart: each parameter
    (given by position or by keyword) by its kind, then the launch options."""
    params = inspect.signature(kernel.fn).parameters
    unspecialised = set(kernel.kwargs.get("do_not_specialize") or ())
    given = dict(zip(params, args))
    given.update((k, v) for k, v in kwargs.items() if k in params)
    key = []
    for name, value in given.items():
        if "constexpr" in str(params[name].annotation):
            key.append((name, repr(value)))
        elif name in unspecialised:
            key.append((name, "unspecialised"))
        elif isinstance(value, torch.Tensor):
            key.append((name, str(value.dtype), value.data_ptr() % 16 == 0))
        elif isinstance(value, int) and not isinstance(value, bool):
            key.append((name, _int_class(value)))
        else:  # a bool ("u1") or a float: its type, never its value
            key.append((name, type(value).__name__))
    key += [(name, repr(value)) for name, value in sorted(kwargs.items()) if name not in params]
    return kernel.fn.__name__, tuple(sorted(key))


def count(shapes, groups):
    """{(kernel, key): the first (base, N, dtype, shape) that launched it}."""
    grid = _grid_module()
    grid._interpreted = lambda launches: launches  # every launch a GPU tells apart
    first, where = {}, {}
    original = InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        first.setdefault(specialisation(self, args, kwargs), dict(where))

    InterpretedFunction.run = record
    try:
        cases = list(enumerate(itertools.product(groups, [
            (s, dt) for s, dt in itertools.product(shapes, grid.DTYPES)
            if s.dtype in (None, dt)]), start=1))
        for base_e, (case, (n, (shape, dt))) in itertools.product((True, False), cases):
            if shape.h % n:
                continue
            where.update(base="e" if base_e else "2", n=n, dtype=dt, shape=str(shape))
            parts = [rank_partial(7, case, r, shape, grid.DTYPES[dt], 4.0, "cpu")
                     for r in range(n)]
            outs, lses = [p[0] for p in parts], [p[1] for p in parts]
            for cfg in grid._configs(outs[0], n):
                tuning.OVERRIDES.update(cfg)
                try:
                    grid._all_backends(outs, lses, base_e)
                finally:
                    tuning.OVERRIDES.clear()
    finally:
        InterpretedFunction.run = original
    return first


def table(first) -> tuple[dict, str]:
    per_kernel = collections.Counter(k[0] for k in first)
    added = {what: collections.Counter() for what in ("base", "n", "dtype")}
    for (kernel, _), where in first.items():
        for what in added:
            added[what][(kernel, where[what])] += 1
    rows = ["| kernel | specialisations | by the LSE base of the launch that added them | "
            "by group size | by dtype |", "|---|--:|---|---|---|"]
    for kernel, total in per_kernel.most_common():
        cells = [", ".join(f"{v}: {c}" for (k, v), c in sorted(added[what].items())
                           if k == kernel) for what in added]
        rows.append(f"| `{kernel}` | {total} | " + " | ".join(cells) + " |")
    rows.append(f"| all | {sum(per_kernel.values())} | | | |")
    data = {"total": sum(per_kernel.values()), "per_kernel": dict(per_kernel.most_common()),
            "added_by": {what: {f"{k} {v}": c for (k, v), c in sorted(cnt.items())}
                         for what, cnt in added.items()}}
    return data, "\n".join(rows)


def _groups(text: str) -> list[int]:
    try:
        groups = [int(g) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected group sizes like 2,4,8") from None
    if not groups or any(g < 1 for g in groups):
        raise argparse.ArgumentTypeError(f"{text!r}: group sizes are integers >= 1")
    return groups


def _shapes(text: str):
    try:
        return parse_shapes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None) -> int:
    p = _run.parser(__doc__, "benchmark_launch_invariance_compiles.py")
    _run.add_out(p, required=False)
    p.add_argument("--shapes", type=_shapes, default=parse_shapes(DEFAULT_SHAPES),
                   help=f"BxHxD[:dtype],... (default {DEFAULT_SHAPES})")
    p.add_argument("--groups", type=_groups, default=[2, 4, 8], help="group sizes (2,4,8)")
    args = p.parse_args(argv)
    with _run.recorded(args.out, "launch_invariance_compiles") as save:
        data, md = table(count(args.shapes, args.groups))
        print(md)
        save(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
