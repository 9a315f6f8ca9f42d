"""Real process groups for the conformance tier: one gloo world of 4 ranks runs every
multi-rank scenario of ``SCENARIOS`` (groups of 2 and 3 ranks, some of them not starting at
global rank 0) through the implementation's ``lse_reduce`` and saves each rank's results; the
tests compare them with the oracle. Each scenario runs inside the implementation's envelope
(:func:`fitted`): a head dim it refuses is raised to the next it takes, a base or group size it
refuses leaves the scenario out, and the test says so. The ranks compute on the GPUs where
there are any (sharing them), else on the CPU.

The group is spawned once per test session (the first xdist worker to need it runs it under a
file lock; the others read its results), so the whole multi-rank part costs one group start.
Every wait is bounded: the process group has a timeout and the parent kills ranks that outlive
the deadline, so a broken implementation fails tests instead of hanging CI.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

WORLD = 4
PG_TIMEOUT_S = 30
DEADLINE_S = 150


@dataclass(frozen=True)
class Scenario:
    name: str
    n: int
    dtype: torch.dtype
    b: int = 3
    h: int = 6
    d: int = 24
    base_e: bool = True
    return_lse: bool = True
    masked: bool = False
    seed: int = 0
    ranks: tuple = ()  # the group's global ranks (sorted); () is ranks 0..n-1
    backend: str | None = None  # dcp_a2a's own backend= (run for the project's code only)
    lse_layout: str = "contiguous"  # "transposed": an [H, B] tensor's view; "broadcast": one
    # LSE per row expanded over the heads (stride 0), as an engine passes a shared value

    @property
    def members(self) -> tuple:
        """Global ranks of the group; group rank r is members[r] (torch orders them so)."""
        return self.ranks or tuple(range(self.n))


SCENARIOS = [
    Scenario("n3_float16_base_e", 3, torch.float16, seed=1),
    Scenario("n3_bfloat16_base_2", 3, torch.bfloat16, base_e=False, seed=2),
    Scenario("n3_float32_out_only", 3, torch.float32, return_lse=False, d=20, seed=3),
    Scenario("n2_bfloat16_base_e", 2, torch.bfloat16, h=4, d=40, seed=4),
    # an engine's DCP group is rarely ranks 0..n-1 of the world (DCP inside TP: every other
    # rank): here group rank 0 is global rank 1, so rank_in_group and the global rank differ
    Scenario("n2_of_ranks_1_2_float16_base_2", 2, torch.float16, h=4, d=24, base_e=False,
             seed=8, ranks=(1, 2)),
    # dcp_a2a's other exchanges on that group: ag_rs weights the local output by the group rank
    *(Scenario(f"n2_of_ranks_1_2_bfloat16_{b}", 2, torch.bfloat16, h=4, d=24, seed=9,
               ranks=(1, 2), backend=b) for b in ("two_collective", "ag_rs")),
    # a second group whose ranks are not the global ones, of another size and a 4-rank world:
    # group rank r is global rank r + 1, and the group's last rank is the world's last
    Scenario("n3_of_ranks_1_2_3_bfloat16_masked", 3, torch.bfloat16, b=5, masked=True,
             seed=10, ranks=(1, 2, 3)),
    Scenario("n3_empty_shards_and_padding", 3, torch.float16, b=5, masked=True, seed=5),
    Scenario("n3_batch_of_zero", 3, torch.float16, b=0, seed=6),
    Scenario("n3_heads_not_divisible", 3, torch.float16, h=4, seed=7),
    # LSEs in other layouts than a contiguous [B, H]: read through their strides
    Scenario("n2_lse_transposed_view", 2, torch.float16, b=4, h=4, seed=11,
             lse_layout="transposed"),
    Scenario("n3_lse_broadcast_over_heads", 3, torch.float32, b=2, seed=12,
             lse_layout="broadcast"),
]
BY_NAME = {s.name: s for s in SCENARIOS}


@dataclass
class DcpGroup:
    """An engine's own group coordinator: any object with these three attributes will do."""

    world_size: int
    rank_in_group: int
    device_group: object


def fitted(sc: Scenario, envelope) -> Scenario | None:
    """``sc`` inside ``envelope`` (:class:`~dcp_a2a.testing.surfaces.Envelope`): its head dim
    raised to the next one the implementation takes; None when its base or group size is one
    the implementation refuses (the scenario does not run). Ranks and tests agree on it."""
    from dataclasses import replace

    if envelope.outside(base_e=sc.base_e, world_size=sc.n):
        return None
    return replace(sc, d=envelope.fit_head_dim(sc.d))


def lse_as_passed(lse: torch.Tensor, layout: str) -> torch.Tensor:
    """A rank's ``lse[B, H]`` in the scenario's layout (same values)."""
    if layout == "transposed":
        return lse.t().contiguous().t()
    if layout == "broadcast":  # the row's value at stride 0, garbage where rows would follow
        b, h = lse.shape
        store = torch.full((b * h + 1,), 1e4, dtype=lse.dtype, device=lse.device)
        store[:b] = lse[:, 0]
        return store[:b].view(b, 1).expand(b, h)
    return lse


def scenario_inputs(sc: Scenario):
    """(outs[N, B, H, D], lses[N, B, H] float32, seq_lens per rank or None, query_start_loc or
    None, lses as the oracle must see them). Same on every rank and in the test process."""
    from dcp_a2a.testing.data import partials

    outs, lses = partials(sc.n, sc.b, sc.h, sc.d, sc.dtype, seed=sc.seed)
    if sc.lse_layout == "broadcast":  # one value a row, shared by the heads
        lses = lses[:, :, :1].expand(lses.shape).contiguous()
    if not sc.masked:
        return outs, lses, None, None, lses
    outs, lses = outs.clone(), lses.clone()
    # requests: rows [0,1) [1,3) [3,4); row 4 is padding. Rank 1 holds no KV of request 1,
    # rank 2 none of request 2; their partials there are garbage and must never reach the merge.
    qsl = torch.tensor([0, 1, 3, 4], dtype=torch.int32)
    seq_lens = [torch.tensor([5, 7, 2], dtype=torch.int32) for _ in range(sc.n)]
    seq_lens[1] = torch.tensor([5, 0, 2], dtype=torch.int32)
    seq_lens[2] = torch.tensor([5, 7, 0], dtype=torch.int32)
    outs[1, 1:3], lses[1, 1:3] = math.nan, 1e30
    outs[2, 3], lses[2, 3] = math.inf, 80.0
    outs[:, 4], lses[:, 4] = math.nan, 3.0
    seen = lses.clone()
    seen[1, 1:3] = -math.inf
    seen[2, 3] = -math.inf
    seen[:, 4] = -math.inf
    return outs, lses, seq_lens, qsl, seen


from dcp_a2a.testing.data import modified, snapshot  # noqa: E402
from dcp_a2a.testing.rankpool import cpu_rank_environment, gpu_count, rank_device  # noqa: E402


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses a tensor's elements occupy (empty for no elements)."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def overlap_problem(kind: str, output: torch.Tensor, input: torch.Tensor) -> str | None:
    """Why a collective may not receive into ``output`` while it sends ``input``, or None.

    ``kind`` "a2a": any shared byte is a race (NCCL has no in-place all-to-all; peers write a
    rank's slices while the collective still reads them). "gather"/"scatter": NCCL's in-place
    forms only, the input being one whole chunk of the output (all-gather) or the output one
    whole chunk of the input (reduce-scatter)."""
    (o0, o1), (i0, i1) = _byte_span(output), _byte_span(input)
    if o1 <= i0 or i1 <= o0:
        return None
    inner, outer = (input, output) if kind == "gather" else (output, input)
    if kind != "a2a" and inner.is_contiguous() and outer.is_contiguous():
        offset = inner.data_ptr() - outer.data_ptr()
        chunk = inner.numel() * inner.element_size()
        if chunk and offset % chunk == 0 and 0 <= offset and offset + chunk <= \
                outer.numel() * outer.element_size():
            return None  # the in-place form
    return (f"its output (bytes {o0:#x}-{o1:#x}) overlaps its input (bytes {i0:#x}-{i1:#x})")


_WATCHED = (("all_to_all_single", "a2a"), ("all_gather_into_tensor", "gather"),
            ("all_gather_single", "gather"), ("reduce_scatter_tensor", "scatter"),
            ("reduce_scatter_single", "scatter"))


def watch_collectives(seen: list) -> None:
    """Route torch.distributed's tensor collectives through a check that appends to ``seen``
    every call whose output overlaps its input (see :func:`overlap_problem`). Gloo with CUDA
    tensors stages through host memory and so hides such a race, as one GPU's groups do: the
    check sees it on any backend. Only calls through torch.distributed's Python functions are
    seen (an implementation's own communicator is not)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for name, kind in _WATCHED:
        real = getattr(c10d, name, None)
        if real is None:
            continue

        def spy(output, input, *args, _real=real, _name=name, _kind=kind, **kwargs):
            if isinstance(output, torch.Tensor) and isinstance(input, torch.Tensor):
                problem = overlap_problem(_kind, output, input)
                if problem:
                    seen.append(f"{_name}: {problem}")
            return _real(output, input, *args, **kwargs)

        setattr(c10d, name, spy)
        if getattr(dist, name, None) is real:
            setattr(dist, name, spy)


def _rank_main(rank: int, init_file: str, out_dir: str, spec: str, device_type: str) -> None:
    if device_type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors need Triton's interpreter
    os.environ["DCP_A2A_CHECK_RANKS"] = "1"  # ranks that disagree fail naming the field
    import torch.distributed as dist

    from dcp_a2a.testing.impl import load_impl

    device = rank_device("gloo", rank, device_type)
    if device.type == "cuda":
        torch.cuda.set_device(device)

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=PG_TIMEOUT_S))
    groups = {tuple(range(WORLD)): dist.group.WORLD}
    for members in sorted({s.members for s in SCENARIOS} - set(groups)):
        groups[members] = dist.new_group(list(members))  # collective: every rank creates each
    results = {}
    overlaps: list[str] = []
    watch_collectives(overlaps)  # before the implementation imports torch.distributed's names
    try:
        impl = load_impl(spec)
        for sc in SCENARIOS:
            if rank not in sc.members or (sc.backend and not impl.is_project):
                continue
            sc = fitted(sc, impl.envelope)
            if sc is None or (sc.masked and not impl.exposes("masking")):
                continue
            me = sc.members.index(rank)  # this process's rank in the DCP group
            outs, lses, seq_lens, qsl, _ = scenario_inputs(sc)
            out = outs[me].to(device)
            lse = lse_as_passed(lses[me].to(device), sc.lse_layout)
            mask = {} if seq_lens is None else dict(seq_lens=seq_lens[me].to(device),
                                                    query_start_loc=qsl.to(device))
            before = snapshot(out=out, lse=lse, **mask)
            if sc.backend:
                mask["backend"] = sc.backend
            t0 = time.time()
            overlaps.clear()
            try:
                res = impl.lse_reduce(out, lse, DcpGroup(sc.n, me, groups[sc.members]),
                                      return_lse=sc.return_lse, is_lse_base_on_e=sc.base_e,
                                      **mask)
                rec = {"ok": True, "result": _to_cpu(res)}
            except Exception as e:  # recorded per scenario; the test decides what it means
                rec = {"ok": False, "error": type(e).__name__, "message": str(e),
                       "traceback": traceback.format_exc(),
                       "unsupported": type(e).__name__ == "Unsupported"}
            rec["seconds"] = time.time() - t0
            rec["inputs_modified"] = modified(before)  # the engine still owns every one
            rec["collective_overlaps"] = sorted(set(overlaps))
            results[sc.name] = rec
    except Exception:
        results["__rank_error__"] = traceback.format_exc()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def _to_cpu(res):
    if isinstance(res, tuple):
        return tuple(_to_cpu(r) for r in res)
    return res.cpu() if isinstance(res, torch.Tensor) else res


def run_group(spec: str, out_dir: Path) -> dict:
    """Spawn WORLD ranks, wait (bounded), and return {"ranks": [results of rank r or None],
    "problems": [text], "seconds": wall}."""
    import torch.multiprocessing as mp

    out_dir.mkdir(parents=True, exist_ok=True)
    init_file = out_dir / "pg_init"
    if init_file.exists():
        init_file.unlink()
    # On a GPU machine the ranks compute on the GPUs (spawned: each needs its own CUDA context).
    # Elsewhere one fork server imports torch once and forks the CPU ranks from it: three
    # concurrent spawns would import torch three times (seconds each on a 2-core machine). It is
    # single-threaded, so forking it is safe, unlike forking a pytest worker.
    device_type = "cuda" if gpu_count() else "cpu"
    if device_type == "cuda":
        ctx = mp.get_context("spawn")
    else:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "dcp_a2a.testing.impl",
                                    "dcp_a2a.testing.data", __name__])
    t0 = time.time()
    procs = [ctx.Process(target=_rank_main,
                         args=(r, str(init_file), str(out_dir), spec, device_type), daemon=True)
             for r in range(WORLD)]
    with cpu_rank_environment() if device_type == "cpu" else contextlib.nullcontext():
        for p in procs:
            p.start()
    problems = []
    for r, p in enumerate(procs):
        p.join(timeout=max(1.0, DEADLINE_S - (time.time() - t0)))
        if p.is_alive():
            p.kill()
            p.join(5)
            problems.append(f"rank {r} still running after {DEADLINE_S} s: killed")
        elif p.exitcode != 0:
            problems.append(f"rank {r} exited with code {p.exitcode}")
    ranks = []
    for r in range(WORLD):
        f = out_dir / f"rank{r}.pt"
        res = torch.load(f, weights_only=False) if f.exists() else None
        if res is None:
            problems.append(f"rank {r} saved no results")
        elif "__rank_error__" in res:
            problems.append(f"rank {r} failed outside any scenario:\n{res['__rank_error__']}")
        ranks.append(res)
    return {"ranks": ranks, "problems": problems, "seconds": time.time() - t0}
