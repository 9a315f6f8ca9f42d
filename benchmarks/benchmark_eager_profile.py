"""Where an eager call's host time goes on a GPU machine, in one short run.

    python benchmarks/benchmark_eager_profile.py [OUT.json] [--calls 2000] [--top 15]

At one decode row (B=64 H=128 D=512 N=8 bfloat16, CUDA tensors), for ``pack_send``,
``unpack_combine`` and ``lse_reduce`` (packed, a group of one: two launches, so no floor or
launcher of its own): the eager time per call (``dcp_a2a.testing.eager.eager_us``: back-to-back
calls, one synchronise at the end, median of 5), the same with every Triton launch replaced by a
no-op (our host work alone, on this machine's CPU and with CUDA tensors;
``benchmark_host_overhead.py``
measures it with CPU tensors; a kept problem's Site refuses a stand-in kernel, so this times the
checked path, not a kept call's), the empty-kernel floor (Triton's launcher with the real launch's
arguments), the real kernel's compiled launcher called directly (what a launch cached per
problem, skipping Triton's Python dispatch, could reach), and cProfile's top functions by own
time over ``--calls`` real calls: which calls make the difference between the host work a CPU
machine measures and what an eager call costs on a GPU machine.
"""
from __future__ import annotations

import cProfile
import io
import platform
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, uninstalled

import torch  # noqa: E402

import _run  # noqa: E402
import dcp_a2a  # noqa: E402
from benchmark_host_overhead import KERNELS, _NoLaunch  # noqa: E402
from dcp_a2a.testing import eager  # noqa: E402

B, H, D, N, DTYPE = 64, 128, 512, 8, torch.bfloat16


def _without_launches(fn, calls: int) -> float:
    """``fn``'s eager us per call with every launch a no-op (benchmark_host_overhead.py's
    stand-ins)."""
    saved = [(mod, name, getattr(mod, name)) for mod, name in KERNELS]
    for mod, name, _ in saved:
        setattr(mod, name, _NoLaunch())
    try:
        return eager.eager_us(fn, calls, 5, torch.cuda.synchronize)[0]
    finally:
        for mod, name, k in saved:
            setattr(mod, name, k)


def _direct_launch(twin, grid, args, kw):
    """The real kernel's compiled launcher called straight, as a launch cached per problem would
    call it: no binding, specialisation or cache look-up in Python. Uses Triton's internals
    (``CompiledKernel.run`` as ``JITFunction.run`` calls it in Triton 3.x), so on another
    version it may not work: the caller reports why and goes on."""
    import inspect

    real = {id(t): getattr(mod, name) for (mod, name), t in eager.twins().items()}[id(twin)]
    params = inspect.signature(real.fn).parameters
    bound = inspect.signature(real.fn).bind(*args, **{k: v for k, v in kw.items() if k in params})
    bound.apply_defaults()
    compiled = real[grid](*args, **kw)  # compiles (or finds) this very specialisation
    g = tuple(grid(bound.arguments) if callable(grid) else grid) + (1, 1)
    stream = torch.cuda.current_stream().cuda_stream
    vals = list(bound.arguments.values())

    def launch():
        compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata,
                     None, None, None, *vals)
    return launch


def _profile(fn, calls: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv=None) -> int:
    ap = _run.parser(__doc__, "benchmark_eager_profile.py")
    _run.add_out(ap, required=False)
    ap.add_argument("--calls", type=_run.positive_int, default=2000)
    ap.add_argument("--top", type=_run.positive_int, default=15)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the point is what CUDA tensors and the compiled launch cost)")
    with _run.recorded(args.out, "eager_profile") as save:
        return profile_ops(args, save)


def profile_ops(args, save) -> int:
    calls = args.calls
    dev = torch.device("cuda")
    p, hpr = dcp_a2a.lse_pack_dim(DTYPE), H // N
    out = torch.randn(B, H, D, device=dev).to(DTYPE)
    lse = torch.randn(B, H, device=dev) * 4
    send = torch.empty(N, B, hpr, D + p, dtype=DTYPE, device=dev)
    dcp_a2a.pack_send(out, lse, send, N, hpr, D, p)
    recv = send.clone()
    group = dcp_a2a.Group(1, 0, None)
    fns = {"pack_send": lambda: dcp_a2a.pack_send(out, lse, send, N, hpr, D, p),
           "unpack_combine": lambda: dcp_a2a.unpack_combine(recv, D, p, False, True),
           "lse_reduce_n1": lambda: dcp_a2a.lse_reduce(out, lse, group)}
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "python": platform.python_version(), "cpu": platform.processor(),
              "shape": f"B={B} H={H} D={D} N={N} bfloat16", "calls": calls, "ops": {}}
    for op, fn in fns.items():
        row = {"eager_us": eager.eager_us(fn, calls, 5, torch.cuda.synchronize)[0],
               "no_launch_us": _without_launches(fn, calls),
               "profile": _profile(fn, calls, args.top)}
        if op == "lse_reduce_n1":  # two launches: no one floor nor launcher to call
            row["floor_us"] = row["direct_launch_us"] = None
            report["ops"][op] = row
            print(f"{op}: eager {row['eager_us']:.2f} us, our host work alone "
                  f"{row['no_launch_us']:.2f} us")
            print(row["profile"])
            continue
        twin, grid, a, kw = eager.capture_launch(fn)
        row["floor_us"] = eager.eager_us(lambda: twin[grid](*a, **kw), calls, 5,
                                         torch.cuda.synchronize)[0]
        try:
            row["direct_launch_us"] = eager.eager_us(_direct_launch(twin, grid, a, kw), calls,
                                                     5, torch.cuda.synchronize)[0]
        except Exception as e:  # Triton's internals differ: say so, keep the rest
            row["direct_launch_us"], row["direct_launch_error"] = None, f"{type(e).__name__}: {e}"
        report["ops"][op] = row
        direct = (f"{row['direct_launch_us']:.2f} us" if row["direct_launch_us"] is not None
                  else f"unavailable ({row['direct_launch_error']})")
        print(f"{op}: eager {row['eager_us']:.2f} us, our host work alone "
              f"{row['no_launch_us']:.2f} us, empty-kernel floor {row['floor_us']:.2f} us, "
              f"the real kernel's compiled launcher called directly {direct}")
        print(row["profile"])
    save(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
