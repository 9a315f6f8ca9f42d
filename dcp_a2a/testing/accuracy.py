"""Accuracy job: every backend of ``lse_reduce`` on a real process group against the float64
oracle, one row per (backend, dtype, shape, LSE base).

    torchrun --nproc-per-node N -m dcp_a2a.testing.accuracy
        [--backend packed|two_collective|ag_rs|symm_mem|all]
        [--dtype float16,bfloat16,float32] [--shapes BxHxD[:dtype],...] [--base e|2|both]
        [--out report.json] [--dist-backend auto|gloo|nccl] [--device auto|cpu|cuda]

NCCL on GPUs (rank r on cuda:LOCAL_RANK); gloo ranks compute on the GPUs where there are any
(several may share one: N = 4 or 8 ranks on a 2-GPU machine) and on the CPU, through Triton's
interpreter, elsewhere. Multi-node works the usual torchrun way. The oracle and the comparison
run on each rank's device in float64.
Every rank regenerates every rank's partial from the seed (rank n's partial comes from the
generator seeded (seed, case, n)), keeps its own as its input and all ranks' slices of its heads
[r*H/N, (r+1)*H/N) for the oracle, so no input travels through the collectives under test.
From B = 3 on a case is an engine's batch, not just random partials (``case_layout``): requests
of one query row and one of two (a speculative step), a padding row at the end, and on some
ranks an empty local KV shard for a request, whose rows carry a NaN partial under a finite LSE,
as attention over no keys leaves them; ``seq_lens``/``query_start_loc`` go to ``lse_reduce``,
and the oracle weighs those rows 0. With a 16-bit output dtype the base-2 cases
hand the LSE over in that dtype (widened by value, as the contract says).
Each rank compares its merged slice with ``dcp_a2a.testing.compare.check_merge`` (bounds from
tolerances.yaml); rank 0 gathers the per-rank reports, prints a table and writes JSON.

Per row: the dtype the LSE was handed over in and the rows of empty shards and padding (summed
over the ranks), max |err| and max error in ulps of the output dtype, worst error / tolerance, the
returned LSE's max |err| and error / tolerance, whether two_collective and symm_mem produced
outputs and LSEs bitwise identical to packed's, and the wall time of one ``lse_reduce`` call (median over
``--iters`` after ``--warmup``, slowest rank). ag_rs is judged against its own bound (its
reduce-scatter sums in the output dtype) and also reported against the A2A bound.
symm_mem (direct stores over symmetric memory) runs on NCCL groups of CUDA ranks; ``all``
leaves it out elsewhere and the report's meta says why.
Exit status 1 when any row exceeds its tolerance or a backend differs bitwise from packed.
Every case's first (untimed) call of the project's implementation runs with
``check_ranks=True``: ranks that disagree on the call fail naming the field, not with garbage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from .. import _env  # noqa: F401  (TRITON_INTERPRET before any kernel is defined)
from . import tolerances as tol
from .data import heads_of
from .outpaths import file_problem

BACKENDS = ("packed", "two_collective", "ag_rs", "symm_mem")
BITWISE_EQUAL_TO_PACKED = ("two_collective", "symm_mem")  # same combine arithmetic
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Decode shapes of the upstream change (B in {1, 16, 128}, H = 128, D = 512), its
# microbenchmark shape (B = 8192, H = 64, D = 512, bfloat16), and a head dim that is not a power
# of two (80: every other default is 512, which a kernel assuming one would pass).
GPU_SHAPES = "1x128x512,16x128x512,128x128x512,8192x64x512:bfloat16,64x32x80"
# Triton runs interpreted on CPU (~0.1-1 s per call and rank): the B = 1 decode shape plus
# small ones, including a head dim that is not a power of two.
CPU_SHAPES = "1x128x512,4x24x40,16x24x64"
CHECK_CHUNK_ELEMENTS = 1 << 24   # oracle work per chunk of rows (float64 temporaries)
INPUTS = ("from B = 3 each case is a batch: decode requests (one of two query rows), a padding "
          "row, empty local KV shards on some ranks (NaN partials, finite LSEs) masked through "
          "seq_lens/query_start_loc; base-2 cases of 16-bit dtypes hand the LSE over in the "
          "output dtype")


@dataclass(frozen=True)
class Shape:
    b: int
    h: int
    d: int
    dtype: str | None = None   # only run for this dtype

    def __str__(self):
        return f"{self.b}x{self.h}x{self.d}"


def parse_shapes(spec: str) -> list[Shape]:
    shapes = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        dims, _, dt = item.partition(":")
        parts = dims.lower().split("x")
        try:
            b, h, d = (int(p) for p in parts)
        except ValueError:
            raise ValueError(f"bad shape {item!r}: expected BxHxD[:dtype], e.g. 16x128x512") \
                from None
        if b < 0 or h < 1 or d < 1:
            raise ValueError(f"bad shape {item!r}: need B >= 0, H >= 1, D >= 1")
        if dt and dt not in DTYPES:
            raise ValueError(f"bad shape {item!r}: unknown dtype {dt!r} "
                             f"(one of {', '.join(DTYPES)})")
        shapes.append(Shape(b, h, d, dt or None))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def resolve_shapes(spec: str | None, world_size: int, gpu: bool):
    """(shapes to run, default shapes skipped because H % world_size != 0). An explicit
    ``spec`` with such a shape is an error; the default sweep just leaves it out."""
    shapes = parse_shapes(spec or (GPU_SHAPES if gpu else CPU_SHAPES))
    bad = [str(s) for s in shapes if s.h % world_size]
    if bad and spec:
        raise ValueError(f"shapes {', '.join(bad)}: H is not divisible by the world size "
                         f"{world_size}")
    return [s for s in shapes if s.h % world_size == 0], bad


def _csv_choice(value: str, choices, all_value="all") -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if items == [all_value]:
        return list(choices)
    bad = [v for v in items if v not in choices]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected {all_value} or a comma list of {', '.join(choices)}")
    return items


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dcp_a2a.testing.accuracy",
        description="Accuracy of lse_reduce on a real process group against the float64 "
                    "oracle (run under torchrun; a plain run is a group of one).",
        epilog=f"Default shapes: on GPUs {GPU_SHAPES}; on CPU, where Triton runs through its "
               f"much slower interpreter, a smaller sweep {CPU_SHAPES}. Shapes whose H is not "
               "divisible by the world size are skipped from the default sweep (an explicit one "
               "is an error). Exit status 1 when any case exceeds its tolerance or "
               "two_collective or symm_mem differs bitwise from packed.",
    )
    p.add_argument("--backend", default="all",
                   type=lambda v: _csv_choice(v, BACKENDS),
                   help="packed, two_collective, ag_rs, symm_mem, a comma list, or all "
                        "(default: all that the group can run; symm_mem needs NCCL and CUDA)")
    p.add_argument("--dtype", default="all", type=lambda v: _csv_choice(v, tuple(DTYPES)),
                   help="float16, bfloat16, float32, a comma list, or all (default)")
    p.add_argument("--shapes", default=None,
                   help="comma list of BxHxD[:dtype] (dtype restricts that shape to one dtype)")
    p.add_argument("--base", default="both", choices=("e", "2", "both"),
                   help="LSE base: natural (e), base 2 (FlashInfer MLA), or both (default)")
    p.add_argument("--out", default=None,
                   help="write the JSON report here (rank 0); checked before the first case, "
                        "and rewritten after every case (\"complete\": false until the end)")
    p.add_argument("--dist-backend", default="auto", choices=("auto", "gloo", "nccl"),
                   help="auto: nccl when every local rank can have a GPU of its own, else "
                        "gloo")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where each rank computes (default auto: rank r on cuda:r with nccl; "
                        "with gloo cuda:(r %% GPUs), ranks sharing GPUs, or the CPU through "
                        "Triton's interpreter on a machine without GPUs)")
    p.add_argument("--impl", default=None,
                   help="implementation under test (package.module[:attr]; default "
                        "$DCP_A2A_IMPL or dcp_a2a). Backends and the bitwise check need the "
                        "project's own implementation; a foreign one runs its default path.")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of every rank's partials (each rank regenerates all of them)")
    p.add_argument("--spread", type=float, default=4.0,
                   help="std of the LSE differences between ranks (nats or bits)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls (GPU 3, CPU 0)")
    p.add_argument("--iters", type=int, default=None, help="timed calls (GPU 20, CPU 1)")
    p.add_argument("--quiet", action="store_true", help="no table on stdout")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


# --------------------------------------------------------------------------- data
def _generator(device, *seed_parts) -> torch.Generator:
    g = torch.Generator(device=device)
    s = 0
    for part in seed_parts:
        s = (s * 1_000_003 + int(part)) % (1 << 62)
    g.manual_seed(s)
    return g


def case_layout(b: int, world: int, case: int):
    """The batch of a case, the same on every rank: ``(query_start_loc, seq_lens, masked)``,
    lists. From B = 3 on: requests of one query row, the first of two (a speculative step), a
    padding row at the end, and empty local KV shards: request ``case % R`` on rank
    ``case % N``, and every request i with (i + case) % 5 == 0 on rank (i + case) % N, so most
    rows still merge every rank. Below B = 3 (decode's B = 1) one request a row, nothing empty:
    every row merges every rank. ``seq_lens[n][i]``: rank n's local KV tokens of request i (0
    for an empty shard). ``masked[n][r]``: row r carries no KV on rank n (an empty shard, or
    padding: padding is empty on every rank and merges to 0 and -inf)."""
    pad = 1 if b >= 3 else 0
    rows = b - pad
    qlens = [2] + [1] * (rows - 2) if pad else [1] * rows
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    owner = [i for i, q in enumerate(qlens) for _ in range(q)] + [None] * pad
    n_req = len(qlens)
    empty = set()
    if pad:
        empty.add((case % n_req, case % world))
        empty.update((i, (i + case) % world) for i in range(n_req) if (i + case) % 5 == 0)
    seq_lens = [[0 if (i, n) in empty else 1 + (5 * i + 3 * n) % 61 for i in range(n_req)]
                for n in range(world)]
    masked = [[o is None or seq_lens[n][o] == 0 for o in owner] for n in range(world)]
    return qsl, seq_lens, masked


def lse_dtype_of(dtype, base_e: bool):
    """The dtype a case hands its LSE over in: float32, or the 16-bit output dtype in base 2."""
    return torch.float32 if base_e or dtype == torch.float32 else dtype


def rank_partial(seed, case, n, shape: Shape, dtype, spread, device):
    """Rank ``n``'s partial (out[B, H, D] in ``dtype``, lse[B, H] float32) of a case: the
    same on every rank that generates it. The per-row LSE level is common to all ranks."""
    g = _generator(device, seed, case, 1 << 20)
    level = torch.randn(shape.b, shape.h, generator=g, device=device) * 8.0 + 5.0
    g = _generator(device, seed, case, n)
    out = torch.randn(shape.b, shape.h, shape.d, generator=g, device=device).to(dtype)
    lse = level + torch.randn(shape.b, shape.h, generator=g, device=device) * spread
    return out, lse


# --------------------------------------------------------------------------- checking
def _nanmax(a: float, b: float) -> float:
    """max that ignores NaN (the LSE has no ulp error) but keeps +inf (a NaN result)."""
    if math.isnan(a):
        return b
    return a if math.isnan(b) else max(a, b)


def _merge_quantity(acc, q):
    if q is None:
        return acc
    d = {"elements": q.elements, "max_abs_err": q.max_abs_err,
         "max_ulp_err": q.max_ulp_err, "worst_ratio": q.worst_ratio, "failures": q.failures,
         "upstream_ok": q.upstream_ok}
    if acc is None:
        return d
    for k in ("max_abs_err", "max_ulp_err", "worst_ratio"):
        acc[k] = _nanmax(acc[k], d[k])
    acc["elements"] += d["elements"]
    acc["failures"] += d["failures"]
    acc["upstream_ok"] = acc["upstream_ok"] and d["upstream_ok"]
    return acc


def check_slice(out, lse, outs, lses, base_e, kind) -> dict:
    """``check_merge`` over row chunks (bounded float64 memory); merged per-quantity stats."""
    from .compare import check_merge

    n, b, hpr, d = outs.shape
    rows = max(1, CHECK_CHUNK_ELEMENTS // max(1, n * hpr * d))
    res = {"output": None, "lse": None}
    for r0 in range(0, max(b, 1), rows):
        sl = slice(r0, r0 + rows)
        rep = check_merge(out[sl], None if lse is None else lse[sl], outs[:, sl], lses[:, sl],
                          is_lse_base_on_e=base_e, kind=kind, keep_ulp_errors=False)
        res["output"] = _merge_quantity(res["output"], rep.output)
        res["lse"] = _merge_quantity(res["lse"], rep.lse)
    return res


def _bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


# --------------------------------------------------------------------------- the job
def _symm_buffers(group, shape: "Shape", dtype, device):
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
    from .impl import load_impl

    pg = pg if pg is not None else dist.group.WORLD
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    device = torch.device(device) if device is not None else torch.device("cpu")
    impl = load_impl(args.impl)
    if not impl.has("lse_reduce"):  # every rank alike: none is left waiting in a collective
        raise ValueError(f"{impl.spec} has no lse_reduce: the accuracy job runs lse_reduce on "
                         "a process group")
    project = impl.is_project
    if not project and list(args.backend) != list(BACKENDS):
        raise ValueError(f"--backend needs the project's implementation; {impl.spec} only has "
                         "its default path")
    gpu = device.type == "cuda"
    not_run = {}
    if "symm_mem" in args.backend and not (gpu and dist.get_backend(pg) == "nccl"):
        why = (f"symm_mem needs an NCCL group of CUDA ranks; this is {dist.get_backend(pg)} on "
               f"{device.type}")
        if list(args.backend) != list(BACKENDS):  # asked for by name
            raise ValueError(why)
        not_run["symm_mem"] = why
    backends = [b for b in args.backend if b not in not_run] if project else ["default"]
    shapes, skipped = resolve_shapes(args.shapes, world, gpu)
    bases = {"e": [True], "2": [False], "both": [True, False]}[args.base]
    warmup = args.warmup if args.warmup is not None else (3 if gpu else 0)
    iters = max(1, args.iters if args.iters is not None else (20 if gpu else 1))
    group = Group(world, rank, pg)

    plan = [(shape, dt_name, base_e) for shape in shapes for dt_name in args.dtype
            if shape.dtype is None or shape.dtype == dt_name for base_e in bases]
    if not plan:  # every rank plans alike, so every rank refuses: no collective is left waiting
        raise ValueError("no case to run: " + (
            f"no shape's H is divisible by the world size {world} ({', '.join(skipped)})"
            if not shapes else f"the shapes ({', '.join(map(str, shapes))}) are restricted to "
            f"other dtypes than --dtype {','.join(args.dtype)}"))
    merged = []
    meta = dict(world_size=world, dist_backend=dist.get_backend(pg),
                device=str(device) if not gpu else torch.cuda.get_device_name(device),
                triton_interpreter=_env.INTERPRET, implementation=impl.spec,
                torch=torch.__version__, python=platform.python_version(), seed=args.seed,
                spread=args.spread, warmup=warmup, iters=iters,
                shapes=[str(s) + (f":{s.dtype}" if s.dtype else "") for s in shapes],
                skipped_shapes=skipped, backends_not_run=not_run,
                tolerances=str(tol.tolerances_path()),
                inputs=INPUTS, cases_planned=len(plan) * len(backends))
    # progress on rank 0 (stderr): large GPU shapes take seconds a case (the float64 oracle)
    bar = tqdm(plan, desc=f"accuracy N={world}", unit="case", disable=rank != 0 or args.quiet)
    for case, (shape, dt_name, base_e) in enumerate(bar, start=1):
        dtype = DTYPES[dt_name]
        bar.set_postfix_str(f"{shape} {dt_name} base {'e' if base_e else '2'}")
        heads = heads_of(rank, world, shape.h)
        qsl, seq_lens, masked = case_layout(shape.b, world, case)
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
                       query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device))
        results = {}
        rows = []
        for be in backends:
            kw = dict(return_lse=True, is_lse_base_on_e=base_e, **meta_kw)
            if be != "default":
                kw["backend"] = be
            if be == "symm_mem":
                kw["buffers"] = _symm_buffers(group, shape, dtype, device)
            # every case first checks that the ranks make the same call: in the first warm-up
            # call, or in a call of its own when there is none (it is never timed)
            checked = dict(kw, check_ranks=True) if project else kw
            for i in range(max(warmup, 1 if project else 0)):
                impl.lse_reduce(mine[0], mine[1], group, **(checked if i == 0 else kw))
            times = []
            for _ in range(iters):
                dist.barrier(group=pg)
                _sync(device)
                t0 = time.perf_counter()
                res = impl.lse_reduce(mine[0], mine[1], group, **kw)
                _sync(device)
                times.append(time.perf_counter() - t0)
            out, lse = res
            kind = "ag_rs" if be == "ag_rs" else "a2a"
            chk = check_slice(out, lse, outs_slice, lses_slice, base_e, kind)
            row = dict(backend=be, dtype=dt_name, shape=str(shape), b=shape.b,
                       h=shape.h, d=shape.d, base="e" if base_e else "2",
                       lse_dtype=str(lse_dtype).replace("torch.", ""),
                       empty_rows=sum(map(sum, masked)),
                       output=chk["output"], lse=chk["lse"],
                       seconds=statistics.median(times))
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


def _report(meta: dict, merged: list[dict], complete: bool) -> dict:
    return {"meta": meta, "cases": merged, "complete": complete,
            "ok": complete and all(m["ok"] for m in merged)}


def merge_rows(gathered: list[list[dict]]) -> list[dict]:
    """One case's rows of every rank -> one row per backend: the worst error over the ranks,
    the slowest rank's time, bitwise equality on every rank."""
    merged = []
    for i, row in enumerate(gathered[0]):
        per_rank = [g[i] for g in gathered]
        m = dict(row)
        for q in ("output", "lse"):
            acc = None
            for pr in per_rank:
                if pr[q] is not None:
                    acc = _merge_quantity(acc, _Q(pr[q]))
            m[q] = acc
        m["seconds"] = max(pr["seconds"] for pr in per_rank)
        if "ratio_vs_a2a_bound" in row:
            m["ratio_vs_a2a_bound"] = max(pr["ratio_vs_a2a_bound"] for pr in per_rank)
        if "bitwise_eq_packed" in row:
            m["bitwise_eq_packed"] = all(pr["bitwise_eq_packed"] for pr in per_rank)
        m["ok"] = (m["output"]["failures"] == 0
                   and (m["lse"] is None or m["lse"]["failures"] == 0)
                   and m.get("bitwise_eq_packed", True))
        merged.append(m)
    return merged


class _Q:
    """A per-quantity dict seen through QuantityReport's attribute names."""

    def __init__(self, d):
        self.__dict__.update(d)


def exit_status(report: dict | None) -> int:
    return 0 if report is None or report["ok"] else 1


def format_table(report: dict) -> str:
    meta = report["meta"]
    head = (f"dcp_a2a accuracy: N={meta['world_size']} {meta['dist_backend']} on "
            f"{meta['device']}{' (Triton interpreter)' if meta['triton_interpreter'] else ''}"
            f", impl {meta['implementation']}")
    cols = (f"{'backend':<14} {'dtype':<8} {'shape':<12} {'base':<4} {'lse in':<8} "
            f"{'empty':>5} {'max|err|':>9} "
            f"{'ulp':>7} {'err/tol':>7} {'lse err':>9} {'lse/tol':>7} {'bitwise':>7} "
            f"{'ms':>9}  status")
    lines = [head, cols, "-" * len(cols)]
    for c in report["cases"]:
        o, s = c["output"], c["lse"] or {}
        bw = c.get("bitwise_eq_packed")
        extra = (f"  (vs A2A tol {c['ratio_vs_a2a_bound']:.3g})"
                 if "ratio_vs_a2a_bound" in c else "")
        lines.append(
            f"{c['backend']:<14} {c['dtype']:<8} {c['shape']:<12} {c['base']:<4} "
            f"{c.get('lse_dtype', '-'):<8} {c.get('empty_rows', '-'):>5} "
            f"{o['max_abs_err']:>9.2e} {o['max_ulp_err']:>7.3g} {o['worst_ratio']:>7.3f} "
            f"{s.get('max_abs_err', float('nan')):>9.2e} {s.get('worst_ratio', float('nan')):>7.3f} "
            f"{'-' if bw is None else ('yes' if bw else 'NO'):>7} {c['seconds'] * 1e3:>9.3f}  "
            f"{'ok' if c['ok'] else 'FAIL'}{extra}")
    for be, why in meta.get("backends_not_run", {}).items():
        lines.append(f"not run: {be} ({why})")
    if meta["skipped_shapes"]:
        lines.append(f"skipped (H not divisible by {meta['world_size']}): "
                     f"{', '.join(meta['skipped_shapes'])}")
    failed = sum(not c["ok"] for c in report["cases"])
    lines += ["", LEGEND, f"{len(report['cases'])} cases, {failed} failed"]
    return "\n".join(lines)


LEGEND = ("columns: lse in = the dtype the ranks hand their LSE over in; empty = rows of empty "
          "KV shards and padding, summed over the ranks (masked through seq_lens/"
          "query_start_loc, NaN partials); max|err| and ulp = the largest output error "
          "(absolute, and in ulps of the output dtype); err/tol = the worst error over its "
          "bound (tolerances.yaml; a row passes at <= 1); lse err, lse/tol = the same for the "
          "returned LSE; bitwise = the row's output and LSE have the same bits as packed's "
          "(two_collective, symm_mem); ms = one lse_reduce call, median, slowest rank. ag_rs "
          "sums in the output dtype, so it is judged against its own, wider bound; "
          "'(vs A2A tol r)' says how far it lands against the A2A paths' bound.")


def write_report(report: dict, path: str) -> None:
    """Write the JSON report atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, path)


def main(argv=None) -> int:
    import datetime

    import torch.distributed as dist

    args = parse_args(argv)
    if "RANK" not in os.environ:  # a plain run: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    from .rankpool import auto_backend, rank_device

    backend = auto_backend() if args.dist_backend == "auto" else args.dist_backend
    try:
        device = rank_device(backend, int(os.environ.get("LOCAL_RANK", "0")),
                             None if args.device == "auto" else args.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if device.type == "cpu" and not _env.INTERPRET:
        # CPU tensors run only through Triton's interpreter; the kernels were defined compiled
        # (a GPU machine), so start this rank again with the interpreter on
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable,
                 [sys.executable, "-m", "dcp_a2a.testing.accuracy", *sys.argv[1:]])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kw = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10), **kw)
    try:
        # rank 0 writes --out: it checks the path before any case and every rank learns the
        # verdict (one rank leaving early would leave the others waiting in a collective)
        problem = [file_problem(args.out) if dist.get_rank() == 0 and args.out else None]
        dist.broadcast_object_list(problem, src=0)
        if problem[0]:
            if dist.get_rank() == 0:
                print(f"error: --out {args.out}: {problem[0]}", file=sys.stderr)
            return 2
        save = (lambda rep: write_report(rep, args.out)) if args.out else None
        try:
            report = run(args, None, device, on_case=save)
        except ValueError as e:
            if dist.get_rank() == 0:
                print(f"error: {e}", file=sys.stderr)
            return 2
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
