"""Tasks the multi-process tests run on the ranks of a :class:`dcp_a2a.testing.rankpool.RankPool`,
and :func:`new_pool`, the pool those tests use.

Every task is ``task(ctx, *args)`` with ``ctx`` the rank's RankContext. They run the
implementation under test, selected by ``$DCP_A2A_IMPL`` (the pytest plugin sets it for every
process), and return plain tensors; all checking happens in the test process against the oracle
of every rank's inputs. Nothing here imports pytest: the ranks only import this module.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from dcp_a2a.testing.data import modified, snapshot
from dcp_a2a.testing.impl import ENV_VAR, load_impl
from dcp_a2a.testing.rankpool import RankPool
from dcp_a2a.testing.surfaces import Unsupported

# Imported by the fork server of CPU pools, so that no rank imports them itself (after every
# pool (re)start): this module (and through it the implementation loader), and the module
# Triton's interpreter imports at its first kernel launch (~0.1 s a rank). A name that fails to
# import is skipped by the fork server: this is only a head start.
RANK_PRELOAD = ("dcp_a2a.testing.tasks", "triton.experimental.gluon")


def new_pool(world_size: int, **kw) -> RankPool:
    """A gloo pool for these tasks: ranks on the GPUs where there are any (compiled kernels),
    else CPU ranks forked from the shared, preloaded fork server (interpreted kernels). Its
    ranks check that every rank makes the same call (``$DCP_A2A_CHECK_RANKS``): a test whose
    ranks disagree fails with the field that differs, not with a gloo abort or garbage."""
    from dcp_a2a.collective import CHECK_RANKS_ENV

    env = {CHECK_RANKS_ENV: "1", **kw.pop("env", {})}
    return RankPool(world_size, preload=RANK_PRELOAD, env=env, **kw)

_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        torch.equal(a.contiguous().view(_BITS[a.element_size()]),
                    b.contiguous().view(_BITS[b.element_size()])))


def _impl():
    return load_impl(os.environ.get(ENV_VAR))


def reduce_cases(ctx, n: int, cases: list, inputs: list) -> list:
    """Run ``lse_reduce`` once per case on this rank of the ``n``-rank group.

    ``cases[i]``: dict(return_lse, base_e, query_start_loc or None, backend or None);
    ``inputs[i]``: this rank's (out[B, H, D], lse[B, H], seq_lens or None). ``backend`` is only
    passed when not None (foreign implementations do not take it). Returns per case a dict
    with the result (out, lse or None, what was returned) and the inputs it modified.
    """
    impl = _impl()
    group = ctx.group(n)
    results = []
    for case, (out, lse, seq_lens) in zip(cases, inputs):
        out, lse = out.to(ctx.device), lse.to(ctx.device)
        kw = dict(return_lse=case["return_lse"], is_lse_base_on_e=case["base_e"])
        if seq_lens is not None:
            kw.update(seq_lens=seq_lens.to(ctx.device),
                      query_start_loc=case["query_start_loc"].to(ctx.device))
        if case.get("backend") is not None:
            kw["backend"] = case["backend"]
        if case.get("backend") == "symm_mem":  # a collective: every rank, the same case
            kw["buffers"] = _symm_buffers(group, out)
        before = snapshot(out=out, lse=lse, seq_lens=kw.get("seq_lens"),
                          query_start_loc=kw.get("query_start_loc"))
        try:
            res = impl.lse_reduce(out, lse, group, **kw)
        except Unsupported as e:  # refused before any collective, alike on every rank
            results.append(dict(unsupported=e.what))
            continue
        if case["return_lse"]:
            if not (isinstance(res, tuple) and len(res) == 2):
                results.append(dict(bad_return=f"return_lse=True returned {type(res).__name__}"))
                continue
            o, g = res
        else:
            if not isinstance(res, torch.Tensor):
                results.append(dict(bad_return=f"return_lse=False returned {type(res).__name__}"))
                continue
            o, g = res, None
        results.append(dict(
            out=o.detach().cpu().clone(),
            lse=None if g is None else g.detach().cpu().clone(),
            inputs_modified=modified(before),  # the engine still owns every one
        ))
    return results


def _symm_buffers(group, out, max_tokens=None):
    from dcp_a2a.symm_mem import SymmMemBuffers

    B, H, D = out.shape
    return SymmMemBuffers(group, max_tokens=max_tokens or max(B, 1), num_heads=H, head_dim=D,
                          dtype=out.dtype, device=out.device)


def symm_back_to_back(ctx, n: int, out, lse, iters: int, seed: int, graph: bool) -> dict:
    """``iters`` symm_mem calls in a row, each after a random delay of this rank's (a spin
    kernel of up to ~50 us, different per rank and call), so a fast rank runs ahead of a slow
    one; call i's inputs are ``out * (i + 1)`` and its LSE ``lse + i``: a slice delivered from
    the wrong call (a reused slot overwritten early, a stale one read) shows in the bits.

    ``graph``: capture one call (delay included) in a CUDA graph and replay it ``iters`` times
    on the same inputs, each replay checked. Returns counts of calls whose output and LSE
    bits differ from the packed backend's on the same inputs."""
    import dcp_a2a

    group = ctx.group(n)
    out, lse = out.to(ctx.device), lse.to(ctx.device)
    bufs = _symm_buffers(group, out)
    gen = torch.Generator().manual_seed(seed * 1000 + ctx.rank)
    cycles = torch.randint(0, 100_000, (iters,), generator=gen).tolist()  # ~0-50 us at ~2 GHz
    if graph:
        x_out, x_lse = out.clone(), lse.clone()
        want = dcp_a2a.lse_reduce(x_out, x_lse, group, return_lse=True)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.cuda._sleep(int(cycles[0]))
            got = dcp_a2a.lse_reduce(x_out, x_lse, group, return_lse=True, backend="symm_mem",
                                     buffers=bufs)
        wrong = 0
        for i in range(iters):
            if i % 2 == ctx.rank % 2:  # ranks alternate who is late, beyond the captured delay
                torch.cuda._sleep(int(cycles[i]))
            g.replay()
            wrong += not (_same_bits(got[0], want[0]) and _same_bits(got[1], want[1]))
        torch.cuda.synchronize()
        return dict(calls=iters, wrong=wrong)
    wants, gots = [], []
    for i in range(iters):
        x_out, x_lse = out * (i + 1), lse + i
        torch.cuda._sleep(int(cycles[i]))
        gots.append(dcp_a2a.lse_reduce(x_out, x_lse, group, return_lse=True,
                                       backend="symm_mem", buffers=bufs))
        if i % 50 == 49 or i == iters - 1:  # the references, in batches: keep ranks racing
            for j in range(len(wants), i + 1):
                wants.append(dcp_a2a.lse_reduce(out * (j + 1), lse + j, group, return_lse=True))
    torch.cuda.synchronize()
    wrong = sum(not (_same_bits(g[0], w[0]) and _same_bits(g[1], w[1]))
                for g, w in zip(gots, wants))
    return dict(calls=iters, wrong=wrong)


def symm_refusal(ctx, n: int) -> str:
    """What making symm_mem buffers on this pool's group says (gloo/CPU groups must refuse)."""
    out = torch.zeros(1, 2 * n, 4, dtype=torch.bfloat16, device=ctx.device)
    try:
        _symm_buffers(ctx.group(n), out)
    except ValueError as e:
        return f"ValueError: {e}"
    return "accepted"


def reduce_expect_error(ctx, n: int, out, lse, kwargs: dict, rank_in_group=None):
    """Call ``lse_reduce`` with arguments that must be rejected; return the exception's type
    name and message (or None when nothing was raised). Must return promptly on every rank:
    an argument check that runs after a collective would leave the peers hanging.
    ``rank_in_group``: the rank the DCP group object claims (default: the true one)."""
    impl = _impl()
    group = ctx.group(n)
    if rank_in_group is not None:
        from dcp_a2a.collective import Group

        group = Group(group.world_size, rank_in_group, group.device_group)
    try:
        impl.lse_reduce(out.to(ctx.device), lse.to(ctx.device), group, **kwargs)
    except Exception as e:  # the test checks the type
        return type(e).__name__, str(e)
    return None


def reduce_expect_error_per_rank(ctx, n: int, kwargs: dict, out, lse, rank_in_group=None):
    """:func:`reduce_expect_error` with this rank's own inputs (``per_rank``): ranks that
    disagree on the call."""
    return reduce_expect_error(ctx, n, out, lse, kwargs, rank_in_group)


# --------------------------------------------------------------------------- pool mechanics
def all_reduce_sum(ctx, n: int, value: float) -> float:
    t = torch.tensor([float(value)], device=ctx.device)
    dist.all_reduce(t, group=ctx.process_group(n))
    return t.item()


def warmup_calls(ctx, n: int, warmup_ms: float, ms_per_call: float) -> int:
    """The collective benchmark's warm-up count on this rank
    (``bench_collective.agreed_warmup_calls``)."""
    from .bench_collective import agreed_warmup_calls

    return agreed_warmup_calls(ms_per_call, warmup_ms, ctx.device, ctx.process_group(n))


def raise_on(ctx, bad_rank: int, message: str):
    """``bad_rank`` raises; the others wait in a barrier that it never joins."""
    if ctx.rank == bad_rank:
        raise ValueError(message)
    dist.barrier(group=ctx.process_group())
    return ctx.rank


def barrier_alone(ctx, lonely_rank: int):
    """``lonely_rank`` enters a collective that no peer joins (a hang in a collective)."""
    if ctx.rank == lonely_rank:
        dist.barrier(group=ctx.process_group())
    return ctx.rank


def sleep_on(ctx, sleepy_rank: int, seconds: float):
    """``sleepy_rank`` stalls outside any collective; the others answer at once."""
    if ctx.rank == sleepy_rank:
        time.sleep(seconds)
    return ctx.rank


def exit_on(ctx, dying_rank: int, code: int):
    if ctx.rank == dying_rank:
        os._exit(code)
    dist.barrier(group=ctx.process_group())
    return ctx.rank


def whoami(ctx):
    return ctx.rank, os.getpid(), os.environ.get(ENV_VAR)


def as_torchrun_rank(ctx, store_port: int, module: str, argv: list) -> int:
    """Run ``python -m MODULE ARGV`` on this rank as torchrun would start it: rank, world size
    and the rendezvous store in the environment (torchrun's variables; the store is hosted by the
    test process, as torchrun's agent hosts it), and the module creates the default process
    group itself. The pool's own group is destroyed first, so the pool must be closed
    afterwards. Returns the module's exit status."""
    import importlib

    dist.destroy_process_group()
    n = str(ctx.world_size)
    os.environ.update(RANK=str(ctx.rank), LOCAL_RANK=str(ctx.rank), GROUP_RANK="0",
                      WORLD_SIZE=n, LOCAL_WORLD_SIZE=n, MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(store_port), TORCHELASTIC_USE_AGENT_STORE="True")
    status = importlib.import_module(module).main(argv)
    return 0 if status is None else int(status)


# --------------------------------------------------------------------------- accuracy job
def accuracy_job(ctx, n: int, argv: list):
    """Run the accuracy job (``dcp-a2a accuracy``) in-process on the pool's ``n``-rank group."""
    from dcp_a2a.testing import accuracy

    args = accuracy.parse_args(argv)
    report = accuracy.run(args, ctx.process_group(n), ctx.device)
    return report, accuracy.exit_status(report)


class _BrokenImpl:
    """A deliberately wrong implementation: the merged LSE is rounded through bfloat16 before
    it is returned, and the output is moved by one bfloat16 ulp-sized relative step. The
    accuracy job (and the suite) must reject it."""

    @staticmethod
    def lse_reduce(out, lse, group, **kw):
        import dcp_a2a

        kw.pop("backend", None)
        res = dcp_a2a.lse_reduce(out, lse, group, **kw)
        if isinstance(res, tuple):
            o, g = res
            return o * (1 + 2.0 ** -7), g.to(torch.bfloat16).to(torch.float32)
        return res * (1 + 2.0 ** -7)

    lse_pack_dim = staticmethod(lambda dtype: __import__("dcp_a2a").lse_pack_dim(dtype))
    pack_send = staticmethod(lambda *a, **k: __import__("dcp_a2a").pack_send(*a, **k))
    unpack_combine = staticmethod(lambda *a, **k: __import__("dcp_a2a").unpack_combine(*a, **k))


BROKEN = _BrokenImpl()


# --------------------------------------------------------------------------- CUDA graphs
def graph_scenario(ctx, scenario: str):
    """One scenario of dcp_a2a.testing.graphs on this rank of the pool's NCCL group: the
    failures it found (an empty list when the implementation under test is right)."""
    from dcp_a2a.testing import graphs

    return graphs.run(scenario, _impl(), ctx.group(), ctx.rank, ctx.world_size, ctx.device)
