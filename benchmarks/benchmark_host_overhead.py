"""Host time of one eager call, without the kernels: pack_send, unpack_combine and
lse_reduce (packed, a group of one) with every Triton launch replaced by a no-op and every kept
launch (``launch.Site``) by one that launches nothing, so what is timed is our own host work
(argument checks, kept keys, staging views, the launch table, building the launch's arguments)
and not Triton's launcher nor the GPU. Runs on any machine (CUDA tensors where there is a GPU,
no kernel launched all the same).

    python benchmarks/benchmark_host_overhead.py [OUT.json] [--calls 20000] [--repeats 7]
        [--profile]

On a CPU machine: CPU tensors, with the launch table's compiled rules (the GPU's) in force:
``tuning`` is handed an ``_env`` that says "compiled" while the argument checks keep the
interpreter's (they would refuse CPU tensors otherwise). Per op: ``--calls`` back-to-back calls timed by the wall clock,
``--repeats`` times, the median us per call. ``--profile`` adds cProfile's top functions by
own time for each op. The numbers are this machine's: compare before and after on one machine.
"""
from __future__ import annotations

import cProfile
import io
import platform
import pstats
import statistics
import time
import types

import torch

import dcp_a2a
from dcp_a2a.kernels import combine, pack, tuning
from dcp_a2a.wire import lse_pack_dim

import _run


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kw)`` does nothing."""

    def __getitem__(self, grid):
        return self._launch

    @staticmethod
    def _launch(*args, **kwargs):
        return None


def _bind_no_site(kernel, grid, *args, **kwargs):
    """Stands in for ``launch.bind``: no launch, and a Site that launches nothing, so a kept
    problem takes the path it takes on a GPU (its Site) and not the unkept re-bind."""
    return _NoSite()


class _NoSite:
    def __call__(self, *addresses):
        return True


BINDS = (pack, combine)  # the modules that bind a launch's Site

KERNELS = ((pack, "_pack_kernel"), (pack, "_pack_slab_kernel"), (pack, "_lse_to_wire_kernel"),
           (combine, "combine_rows"), (combine, "_scale_kernel"))

# (B, H, D, N, dtype): two of the 17 decode rows
SHAPES = ((64, 128, 512, 8, torch.bfloat16), (64, 32, 128, 4, torch.float32))


def ops_at(b, h, d, n, dtype):
    """{name: zero-argument call} on tensors of one shape: CUDA where there is a GPU (with the
    interpreter off, the checks refuse CPU tensors), else the CPU."""
    g = torch.Generator().manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    p, hpr = lse_pack_dim(dtype), h // n
    out = torch.randn((b, h, d), generator=g).to(dtype).to(dev)
    lse = torch.randn((b, h), generator=g).to(dev)
    send = torch.empty((n, b, hpr, d + p), dtype=dtype, device=dev)
    group = dcp_a2a.Group(1, 0, None)
    return {
        "pack_send": lambda: dcp_a2a.pack_send(out, lse, send, n, hpr, d, p),
        "unpack_combine": lambda: dcp_a2a.unpack_combine(send, d, p, False, True),
        "unpack_combine_lse": lambda: dcp_a2a.unpack_combine(send, d, p, True, True),
        "lse_reduce_n1": lambda: dcp_a2a.lse_reduce(out, lse, group),
    }


def per_call_us(fn, calls, repeats):
    for _ in range(min(calls, 200)):  # warm: caches, the allocator
        fn()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs), runs


def profile(fn, calls):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    return s.getvalue()


def main(argv=None):
    ap = _run.parser(__doc__, "benchmark_host_overhead.py")
    _run.add_out(ap, required=False)
    ap.add_argument("--calls", type=_run.positive_int, default=20000)
    ap.add_argument("--repeats", type=_run.positive_int, default=7)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    with _run.recorded(args.out, "host_overhead") as save:
        measure(args, save)


def measure(args, save):
    saved = ([(m, k, getattr(m, k)) for m, k in KERNELS] + [(m, "bind", m.bind) for m in BINDS]
             + [(tuning, "_env", tuning._env)])
    for m, k in KERNELS:
        setattr(m, k, _NoLaunch())
    for m in BINDS:
        m.bind = _bind_no_site
    tuning._env = types.SimpleNamespace(INTERPRET=False)  # the GPU's launch table
    rows = []
    try:
        for b, h, d, n, dtype in SHAPES:
            shape = f"B={b} H={h} D={d} N={n} {str(dtype).removeprefix('torch.')}"
            for name, fn in ops_at(b, h, d, n, dtype).items():
                us, runs = per_call_us(fn, args.calls, args.repeats)
                rows.append({"shape": shape, "op": name, "host_us": us, "runs_us": runs})
                print(f"{shape:32} {name:20} {us:7.2f} us/call "
                      f"[{min(runs):.2f}-{max(runs):.2f}]", flush=True)
                if args.profile:
                    print(profile(fn, args.calls // 4))
    finally:
        for m, k, v in saved:
            setattr(m, k, v)
    save({"machine": platform.processor() or platform.machine(),
          "python": platform.python_version(), "torch": torch.__version__,
          "calls": args.calls, "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
