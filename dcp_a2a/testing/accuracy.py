"""``dcp-a2a accuracy``: every backend of ``lse_reduce`` on a real process group against the
float64 oracle, one row per (backend, dtype, shape, LSE base).

    torchrun --nproc-per-node N -m dcp_a2a accuracy
        [--backend packed|two_collective|ag_rs|symm_mem|all]
        [--dtype float16,bfloat16,float32] [--shapes BxHxD[:dtype],...] [--base e|2|both]
        [--out report.json] [--dist-backend auto|gloo|nccl] [--device auto|cpu|cuda]

(``dcp-a2a accuracy`` without torchrun is a group of one; ``python -m dcp_a2a.testing.accuracy``
is the same program.) NCCL on GPUs (rank r on cuda:LOCAL_RANK); gloo ranks compute on the GPUs
where there are any (several may share one: N = 4 or 8 ranks on a 2-GPU machine) and on the
CPU, through Triton's interpreter, elsewhere. Multi-node works the usual torchrun way. The
oracle and the comparison run on each rank's device in float64.

The cases: :mod:`.accuracy_cases`; the checks, rows, table and JSON: :mod:`.accuracy_report`.
Every check of the arguments, the implementation under test (its ``lse_reduce`` must take the
contract's arguments) and the cases (shapes the world size divides, the memory a case needs on
this rank's device) runs on every rank before the process group starts: a bad job stops with one
line (rank 0's) and exit status 2, and no rank waits for another. ag_rs is judged against its
own bound (its reduce-scatter sums in the output dtype) and also reported against the A2A
bound. symm_mem (direct stores over symmetric memory) runs on NCCL groups of CUDA ranks;
``all`` leaves it out elsewhere and the report's meta says why. Every case's first (untimed)
call of the project's implementation runs with ``check_ranks=True``: ranks that disagree on the
call fail naming the field, not with garbage.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from .. import _env  # noqa: F401  (TRITON_INTERPRET before any kernel is defined)
from . import args as a
from . import tolerances as tol
from .accuracy_cases import (CPU_SHAPES, DTYPES, GPU_SHAPES, INPUTS, INPUTS_UNMASKED, Shape,
                             case_bytes, case_layout, lse_dtype_of, rank_partial,
                             resolve_shapes, shape_list)
from .accuracy_report import (_bits, _report, check_slice, exit_status, format_table,
                              merge_rows, write_report)
from .data import heads_of

SUMMARY = ("lse_reduce on a real process group against the float64 oracle (under torchrun: "
           "per rank)")
DESCRIPTION = ("Accuracy of lse_reduce on a real process group against the float64 oracle (run "
               "under torchrun: torchrun --nproc-per-node N -m dcp_a2a accuracy; a plain run is "
               "a group of one).")
EPILOG = (f"Default shapes: on GPUs {GPU_SHAPES}; on CPU, where Triton runs through its much "
          f"slower interpreter, a smaller sweep {CPU_SHAPES}. Shapes whose H is not divisible by "
          "the world size are skipped from the default sweep (an explicit one is an error). Exit "
          "status 1 when any case exceeds its tolerance, the implementation raised in a case, "
          "or two_collective or symm_mem differs bitwise from packed; 2 a usage error (before "
          "the process group starts); 5 no case could be judged.")
BACKENDS = ("packed", "two_collective", "ag_rs", "symm_mem")
BITWISE_EQUAL_TO_PACKED = ("two_collective", "symm_mem")  # same combine arithmetic
# calls of one case at most (each a collective): more only looks like a hang
MAX_CALLS = 10_000
# LSE differences beyond this overflow the float32 LSEs the ranks draw (6 sigma of 1e30 is
# still finite; the merge of such ranks is one rank's partial)
MAX_SPREAD = 1e30
MAX_SEED = 2**32 - 1  # numpy's range; a larger one would alias a smaller one in the mixing


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="all", type=a.items(BACKENDS, "backend", all_value="all"),
                   help="packed, two_collective, ag_rs, symm_mem, a comma list, or all "
                        "(default: all that the group can run; symm_mem needs NCCL and CUDA)")
    p.add_argument("--dtype", default="all",
                   type=a.items(tuple(DTYPES), "dtype", all_value="all"),
                   help="float16, bfloat16, float32, a comma list, or all (default)")
    p.add_argument("--shapes", default=None, type=shape_list,
                   help="comma list of distinct BxHxD[:dtype] (B >= 0, H and D >= 1; dtype "
                        "restricts that shape to one dtype)")
    p.add_argument("--base", default="both", choices=("e", "2", "both"),
                   help="LSE base: natural (e), base 2 (FlashInfer MLA), or both (default)")
    p.add_argument("--out", default=None, type=a.out_file,
                   help="write the JSON report here (rank 0; its directory is created if "
                        "missing); checked before the first case, and rewritten after every "
                        "case (\"complete\": false until the end)")
    p.add_argument("--dist-backend", default="auto", choices=("auto", "gloo", "nccl"),
                   help="auto: nccl when every local rank can have a GPU of its own, else "
                        "gloo")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where each rank computes (default auto: rank r on cuda:r with nccl; "
                        "with gloo cuda:(r %% GPUs), ranks sharing GPUs, or the CPU through "
                        "Triton's interpreter on a machine without GPUs)")
    p.add_argument("--impl", default=None,
                   type=a.text("an implementation spec, package.module[:attr]"),
                   help="implementation under test (package.module[:attr]; default "
                        "$DCP_A2A_IMPL or dcp_a2a). Backends and the bitwise check need the "
                        "project's own implementation; a foreign one runs its default path.")
    p.add_argument("--seed", type=a.count(0, MAX_SEED), default=0,
                   help=f"seed of every rank's partials, 0 to {MAX_SEED} (each rank regenerates "
                        "all of them)")
    p.add_argument("--spread", type=a.number(0, MAX_SPREAD, what="spread"), default=4.0,
                   help="std of the LSE differences between ranks (nats or bits; 0 to "
                        f"{MAX_SPREAD:g})")
    p.add_argument("--warmup", type=a.count(0, MAX_CALLS), default=None,
                   help=f"untimed calls a case, 0 to {MAX_CALLS} (GPU 3, CPU 0)")
    p.add_argument("--iters", type=a.count(1, MAX_CALLS), default=None,
                   help=f"timed calls a case, 1 to {MAX_CALLS} (GPU 20, CPU 1)")
    p.add_argument("--quiet", action="store_true", help="no table on stdout")


def parse_args(argv=None) -> argparse.Namespace:
    """The job's arguments as ``dcp-a2a accuracy ARGV`` takes them."""
    from . import cli

    return cli.arguments("accuracy", argv)


# --------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """What the job will run, decided the same way on every rank before anything runs."""

    impl: object
    backends: list
    not_run: dict
    shapes: list
    skipped: list
    outside: dict
    cases: list            # (shape, dtype name, base_e)
    masking: bool          # the implementation takes seq_lens / query_start_loc
    warmup: int
    iters: int
    extra: dict = field(default_factory=dict)


def _takes(fn, kw: dict) -> str | None:
    """Why ``fn(out, lse, group, **kw)`` cannot be called, or None."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the call will say
        return None
    try:
        sig.bind(None, None, None, **kw)
    except TypeError as e:
        return f"{e} (its signature: lse_reduce{sig})"
    return None


def plan(args, world: int, device, dist_backend: str) -> Plan:
    """The job's cases for ``world`` ranks of a ``dist_backend`` group on ``device``:
    ValueError, naming the problem, for a job that cannot run (the same on every rank)."""
    from .impl import load_impl

    gpu = torch.device(device).type == "cuda"
    impl = load_impl(args.impl)
    if not impl.has("lse_reduce"):
        raise ValueError(f"{impl.spec} has no lse_reduce: the accuracy job runs lse_reduce on "
                         "a process group")
    project = impl.is_project
    if not project and list(args.backend) != list(BACKENDS):
        raise ValueError(f"--backend needs the project's implementation; {impl.spec} only has "
                         "its default path")
    base_kw = dict(return_lse=True, is_lse_base_on_e=True)
    mask_kw = dict(seq_lens=None, query_start_loc=None)
    fn = getattr(impl.obj, "lse_reduce")
    why = _takes(fn, base_kw)
    if why:
        raise ValueError(f"{impl.spec}'s lse_reduce does not take the contract's arguments "
                         f"(out, lse, group, *, return_lse, is_lse_base_on_e): {why}")
    masking = _takes(fn, {**base_kw, **mask_kw}) is None
    not_run = {}
    if project and "symm_mem" in args.backend and not (gpu and dist_backend == "nccl"):
        why = (f"symm_mem needs an NCCL group of CUDA ranks; this is {dist_backend} on "
               f"{torch.device(device).type}")
        if list(args.backend) != list(BACKENDS):  # asked for by name
            raise ValueError(why)
        not_run["symm_mem"] = why
    backends = [b for b in args.backend if b not in not_run] if project else ["default"]
    shapes, skipped = resolve_shapes(args.shapes, world, gpu)
    env = impl.envelope
    outside = {}
    for s in shapes:
        why = env.outside(head_dim=s.d, world_size=world)
        if why:
            outside[str(s)] = why
    if outside and args.shapes is not None:
        raise ValueError(f"{impl.spec} takes no {', '.join(outside)}: outside its envelope "
                         f"({'; '.join(sorted(set(outside.values())))})")
    shapes = [s for s in shapes if str(s) not in outside]
    bases = {"e": [True], "2": [False], "both": [True, False]}[args.base]
    cases = [(shape, dt_name, base_e) for shape in shapes for dt_name in args.dtype
             if shape.dtype is None or shape.dtype == dt_name for base_e in bases
             if env.outside(lse_dtype=lse_dtype_of(DTYPES[dt_name], base_e),
                            base_e=base_e) is None]
    if not cases:
        raise ValueError("no case to run: " + (
            f"no shape's H is divisible by the world size {world} ({', '.join(skipped)})"
            if not shapes and skipped else
            f"every shape is outside {impl.spec}'s envelope" if not shapes else
            f"the shapes ({', '.join(map(str, shapes))}) are restricted to other dtypes than "
            f"--dtype {','.join(args.dtype)}" if all(s.dtype for s in shapes) else
            f"{impl.spec}'s envelope takes none of them ({env.describe()})"))
    warmup = args.warmup if args.warmup is not None else (3 if gpu else 0)
    iters = args.iters if args.iters is not None else (20 if gpu else 1)
    return Plan(impl, backends, not_run, shapes, skipped, outside, cases, masking, warmup, iters)


def check_memory(p: Plan, world: int, device, ranks_here: int) -> None:
    """ValueError for a case this rank cannot hold (before hours of work end in an allocator's
    traceback)."""
    from .devices import device_memory

    have, where = device_memory(device, ranks_here)
    worst = max(p.cases, key=lambda c: case_bytes(c[0], DTYPES[c[1]], world))
    need = case_bytes(worst[0], DTYPES[worst[1]], world)
    if need > have:
        raise ValueError(f"shape {worst[0]} ({worst[1]}) needs about {need / 2**30:.3g} GiB a "
                         f"rank, more than {where} ({have / 2**30:.3g} GiB a rank): give "
                         "smaller shapes")


# --------------------------------------------------------------------------- the job
def _symm_buffers(group, shape: Shape, dtype, device):
    """Symmetric-memory buffers sized for this case (a collective: every rank makes them at the
    same case)."""
    from ..symm_mem import SymmMemBuffers

    return SymmMemBuffers(group, max_tokens=shape.b, num_heads=shape.h, head_dim=shape.d,
                          dtype=dtype, device=device)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace, pg=None, device=None, on_case=None) -> dict | None:
    """Run every case on process group ``pg`` (default WORLD) with tensors on ``device``.

    Returns the report on rank 0 of the group, ``None`` on the others. Each case's rows are
    gathered as soon as it ends; ``on_case(report)`` (rank 0) sees the report of the cases done
    so far (``complete`` false), so a long job that dies later keeps what it finished.
    """
    import torch.distributed as dist

    from ..collective import Group
    from .surfaces import Unsupported

    pg = pg if pg is not None else dist.group.WORLD
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    device = torch.device(device) if device is not None else torch.device("cpu")
    gpu = device.type == "cuda"
    p = plan(args, world, device, dist.get_backend(pg))
    impl, project = p.impl, p.impl.is_project
    group = Group(world, rank, pg)
    merged = []
    meta = dict(world_size=world, dist_backend=dist.get_backend(pg),
                device=str(device) if not gpu else torch.cuda.get_device_name(device),
                triton_interpreter=_env.INTERPRET, implementation=impl.spec,
                torch=torch.__version__, python=platform.python_version(), seed=args.seed,
                spread=args.spread, warmup=p.warmup, iters=p.iters,
                shapes=[str(s) + (f":{s.dtype}" if s.dtype else "") for s in p.shapes],
                skipped_shapes=p.skipped, backends_not_run=p.not_run,
                outside_envelope=p.outside, masking=p.masking,
                tolerances=str(tol.tolerances_path()),
                inputs=INPUTS if p.masking else INPUTS_UNMASKED,
                cases_planned=len(p.cases) * len(p.backends))
    # progress on rank 0 (stderr): large GPU shapes take seconds a case (the float64 oracle)
    bar = tqdm(p.cases, desc=f"accuracy N={world}", unit="case", disable=rank != 0 or args.quiet)
    for case, (shape, dt_name, base_e) in enumerate(bar, start=1):
        dtype = DTYPES[dt_name]
        bar.set_postfix_str(f"{shape} {dt_name} base {'e' if base_e else '2'}")
        heads = heads_of(rank, world, shape.h)
        qsl, seq_lens, masked = case_layout(shape.b, world, case, masking=p.masking)
        lse_dtype = lse_dtype_of(dtype, base_e)
        outs_slice, lses_slice = [], []
        mine = None
        for n in range(world):
            o, s = rank_partial(args.seed, case, n, shape, dtype, args.spread, device)
            empty = torch.tensor(masked[n], dtype=torch.bool, device=device)
            o[empty] = float("nan")  # attention over no keys; its LSE stays finite garbage
            s = s.to(lse_dtype)
            if n == rank:
                mine = (o, s)
            outs_slice.append(o[:, heads].clone())
            lses_slice.append(s[:, heads].to(torch.float32).masked_fill(empty[:, None],
                                                                         -math.inf))
            del o, s
        outs_slice = torch.stack(outs_slice)
        lses_slice = torch.stack(lses_slice)
        meta_kw = dict(seq_lens=torch.tensor(seq_lens[rank], dtype=torch.int32, device=device),
                       query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device)
                       ) if p.masking else {}
        results = {}
        rows = []
        for be in p.backends:
            row = dict(backend=be, dtype=dt_name, shape=str(shape), b=shape.b,
                       h=shape.h, d=shape.d, base="e" if base_e else "2",
                       lse_dtype=str(lse_dtype).replace("torch.", ""),
                       empty_rows=sum(map(sum, masked)))
            kw = dict(return_lse=True, is_lse_base_on_e=base_e, **meta_kw)
            if be != "default":
                kw["backend"] = be
            try:
                if be == "symm_mem":
                    kw["buffers"] = _symm_buffers(group, shape, dtype, device)
                # every case first checks that the ranks make the same call: in the first
                # warm-up call, or in a call of its own when there is none (never timed)
                checked = dict(kw, check_ranks=True) if project else kw
                for i in range(max(p.warmup, 1 if project else 0)):
                    impl.lse_reduce(mine[0], mine[1], group, **(checked if i == 0 else kw))
                times = []
                for _ in range(p.iters):
                    dist.barrier(group=pg)
                    _sync(device)
                    t0 = time.perf_counter()
                    res = impl.lse_reduce(mine[0], mine[1], group, **kw)
                    _sync(device)
                    times.append(time.perf_counter() - t0)
                out, lse = res
            except Unsupported as e:  # the engine's API cannot express this case
                rows.append(dict(row, not_applicable=e.what))
                continue
            except Exception as e:  # the implementation under test failed this case
                rows.append(dict(row, error=f"{type(e).__name__}: {e}".splitlines()[0][:300]))
                continue
            kind = "ag_rs" if be == "ag_rs" else "a2a"
            chk = check_slice(out, lse, outs_slice, lses_slice, base_e, kind)
            row.update(output=chk["output"], lse=chk["lse"], seconds=statistics.median(times))
            if be == "ag_rs":
                row["ratio_vs_a2a_bound"] = check_slice(
                    out, None, outs_slice, lses_slice, base_e, "a2a")["output"][
                        "worst_ratio"]
            results[be] = (out, lse)
            rows.append(row)
        if "packed" in results:
            po, pl = results["packed"]
            case_rows = {row["backend"]: row for row in rows}
            for be in BITWISE_EQUAL_TO_PACKED:
                if be in results:
                    o, s = results[be]
                    case_rows[be]["bitwise_eq_packed"] = bool(
                        torch.equal(_bits(po), _bits(o)) and torch.equal(_bits(pl), _bits(s)))
        del outs_slice, lses_slice, mine, results
        gathered = [None] * world
        dist.all_gather_object(gathered, rows, group=pg)
        if rank == 0:
            merged += merge_rows(gathered)
            if on_case is not None:
                on_case(_report(meta, merged, complete=False))
    return _report(meta, merged, complete=True) if rank == 0 else None


def usage(message: str) -> int:
    """A usage error before any work: one line (rank 0's under torchrun), exit status 2."""
    if os.environ.get("RANK", "0") == "0":
        print(f"dcp-a2a accuracy: error: {message}", file=sys.stderr, flush=True)
    return a.EXIT_USAGE


def main(args=None) -> int:
    """``dcp-a2a accuracy`` on this rank (a group of one outside torchrun); ``args``: its
    parsed arguments, or an argument list."""
    import datetime

    import torch.distributed as dist

    args = parse_args(args)
    if "RANK" not in os.environ:  # a plain run: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    from .devices import auto_backend, rank_device

    backend = auto_backend() if args.dist_backend == "auto" else args.dist_backend
    try:
        device = rank_device(backend, int(os.environ.get("LOCAL_RANK", "0")),
                             None if args.device == "auto" else args.device)
    except ValueError as e:
        return usage(str(e))
    if device.type == "cpu" and not _env.INTERPRET:
        # CPU tensors run only through Triton's interpreter; the kernels were defined compiled
        # (a GPU machine), so start this rank again with the interpreter on
        os.environ["TRITON_INTERPRET"] = "1"
        argv = args.argv if getattr(args, "argv", None) else ["accuracy"]
        os.execv(sys.executable, [sys.executable, "-m", "dcp_a2a", *argv])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device.type == "cuda":
        ranks_here = -(-ranks_here // max(1, torch.cuda.device_count()))  # ranks a GPU
    try:  # every rank alike, before the group: a refusal leaves no rank waiting
        p = plan(args, world, device, backend)
        check_memory(p, world, device, ranks_here)
    except ValueError as e:
        return usage(str(e))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kw = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10), **kw)
    try:
        save = (lambda rep: write_report(rep, args.out)) if args.out else None
        try:
            report = run(args, None, device, on_case=save)
        except ValueError as e:
            return usage(str(e))
        if report is not None:
            if not args.quiet:
                print(format_table(report), flush=True)
            if save:
                save(report)
        status = torch.tensor([exit_status(report)], dtype=torch.int32,
                              device=device if backend == "nccl" else "cpu")
        dist.broadcast(status, src=0)
        return int(status.item())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
