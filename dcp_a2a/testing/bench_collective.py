"""``dcp-a2a bench --collective`` (under torchrun, one rank per GPU, NCCL): the real exchange
end to end.

``lse_reduce`` with each backend (packed, two_collective, ag_rs, and symm_mem on NCCL groups of
CUDA ranks), median over iterations, as CUDA-graph replays where the path captures (NCCL
collectives and symm_mem do) and with events otherwise, after ``WARMUP_MS`` of untimed calls
(their number agreed by the ranks); rank 0 prints the table, each backend's time over packed's
and packed's over symm_mem's (its speed-up). Without CUDA it runs on gloo with CPU tensors (a
smoke test of the code path; the times mean nothing).
"""

from __future__ import annotations

import torch

from .timing import WARMUP_MS, _warm_up_calls


COLLECTIVE_SHAPES = [(b, h) for h in (64, 128) for b in (1, 16, 128, 1024, 8192)]


def agreed_warmup_calls(ms_per_call: float, warmup_ms: float, device,
                        group=None) -> int:
    """Untimed calls that make up at least ``warmup_ms`` at each rank's own ``ms_per_call``: the
    most any rank of ``group`` asks for, the same number on every rank. Each call is a
    collective, so ranks that ran different counts would leave one waiting in its last call for
    peers that never join."""
    import torch.distributed as dist

    n = torch.tensor([_warm_up_calls(warmup_ms, ms_per_call)], dtype=torch.int64, device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX, group=group)
    return int(n.item())


def _time_collective(fn, device, iters: int) -> tuple[float, str, int]:
    """Median microseconds of one ``fn()`` (a collective) over ``iters`` calls, each started
    after a barrier: CUDA-graph replays where ``fn`` captures, events where it does not, wall
    clock on CPU ranks; after WARMUP_MS of untimed calls, as ``time_us`` warms up. Returns (us,
    method, untimed calls)."""
    import time

    import torch.distributed as dist

    for _ in range(3):
        fn()
    runner, method = fn, ("events" if device.type == "cuda" else "wall")
    # Only NCCL's collectives capture. Trying to capture a gloo collective is not just a failed
    # capture: gloo's own thread copies CUDA tensors while this one captures, and that error
    # surfaces later, in the next barrier (seen on one H200 with 2 gloo ranks sharing it).
    if device.type == "cuda" and dist.get_backend() == "nccl":
        try:
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            runner, method = g.replay, "graph"
        except Exception:  # a path that does not capture: plain launches
            torch.cuda.synchronize()
    if device.type == "cuda":

        def once() -> float:  # ms
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            runner()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b)
    else:

        def once() -> float:
            t0 = time.perf_counter()
            runner()
            return (time.perf_counter() - t0) * 1e3
    dist.barrier()
    warm = agreed_warmup_calls(once(), WARMUP_MS, device)
    for _ in range(warm):
        runner()
    times = []
    for _ in range(iters):
        dist.barrier()
        times.append(once() * 1e3)
    times.sort()
    return times[len(times) // 2], method, warm + 1


def shapes_to_run(shapes, world: int) -> list[tuple[int, int]]:
    """The (B, H) shapes of a run on ``world`` ranks: ``shapes`` (``--shapes``), every one's H
    divisible by ``world`` (else ValueError), or the default ones that are."""
    if shapes:
        bad = [f"{b}x{h}" for (b, h), _ in shapes if h % world]
        if bad:
            raise ValueError(f"--shapes {', '.join(bad)}: H is not divisible by the world size "
                             f"{world}")
        return [dims for dims, _ in shapes]
    return [(b, h) for b, h in COLLECTIVE_SHAPES if h % world == 0]


def run(args) -> int:
    """End-to-end lse_reduce per backend on the real group (this process is one rank started by
    torchrun; the arguments are checked)."""
    import os

    import torch.distributed as dist

    from ..collective import BACKENDS, Group, lse_reduce
    from ..symm_mem import SymmMemBuffers
    from .devices import auto_backend, rank_device
    from .outpaths import make_parent

    world = int(os.environ["WORLD_SIZE"])
    shapes = shapes_to_run(args.shapes, world)  # every rank alike, before the group starts
    if not shapes:
        raise ValueError(f"no default shape's H is divisible by the world size {world}: give "
                         "--shapes")
    backend = auto_backend()
    device = rank_device(backend, int(os.environ.get("LOCAL_RANK", "0")))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    # the device bound to an NCCL group: its barriers use it (unbound, each warns it guessed)
    dist.init_process_group(backend, **({"device_id": device} if backend == "nccl" else {}))
    rank, world = dist.get_rank(), dist.get_world_size()
    group = Group.from_process_group()
    # symm_mem stores into peers' GPU memory: NCCL groups of CUDA ranks only
    backends = [be for be in BACKENDS if be != "symm_mem" or (cuda and backend == "nccl")]
    d = args.head_dim
    rows = []
    for b, h in shapes:
        g = torch.Generator(device="cpu").manual_seed(rank)
        out = torch.randn((b, h, d), generator=g).to(torch.bfloat16).to(device)
        lse = (torch.randn((b, h), generator=g) * 4).to(device)
        res = {}
        for backend in backends:
            kw = {"backend": backend}
            if backend == "symm_mem":
                kw["buffers"] = SymmMemBuffers(group, max_tokens=b, num_heads=h, head_dim=d,
                                               dtype=out.dtype, device=device)
            res[backend] = _time_collective(lambda: lse_reduce(out, lse, group, **kw), device,
                                            args.iters)
        row = {"B": b, "H": h, "D": d, "N": world,
               **{f"{k}_us": v[0] for k, v in res.items()},
               **{f"{k}_timing": v[1] for k, v in res.items()},
               **{f"{k}_untimed_calls": v[2] for k, v in res.items()},
               **{f"{k}_over_packed": res[k][0] / res["packed"][0]
                  for k in backends if k != "packed"}}
        if "symm_mem" in res:
            row["symm_mem_speedup"] = res["packed"][0] / res["symm_mem"][0]
        rows.append(row)
    if rank == 0:
        import json

        with open(make_parent(args.out), "w") as f:
            json.dump({"world_size": world, "device": str(device), "backends": backends,
                       "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                       "rows": rows}, f, indent=1)
        others = [be for be in backends if be != "packed"]
        print(f"{'B':>6} {'H':>4} " + " ".join(f"{be + ' us':>16}" for be in backends)
              + " " + " ".join(f"{be + '/packed':>20}" for be in others)
              + (f" {'symm speed-up':>13}" if "symm_mem" in backends else "") + " timing")
        for r in rows:
            print(f"{r['B']:6d} {r['H']:4d} "
                  + " ".join(f"{r[be + '_us']:16.1f}" for be in backends) + " "
                  + " ".join(f"{r[be + '_over_packed']:20.2f}" for be in others)
                  + (f" {r['symm_mem_speedup']:12.2f}x" if "symm_mem" in backends else "")
                  + f" {r['packed_timing']}")
    dist.destroy_process_group()
    return 0

