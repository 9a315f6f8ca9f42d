"""GPU tier: staging buffers under CUDA graphs. One test per incident that shipped elsewhere;
each runs on the project's StagingBuffers (must pass) and on the design that broke (must fail,
xfail strict: if the broken design ever passes, the test has lost its power)."""

from __future__ import annotations

import random

import pytest
import torch

from dcp_a2a import Group, StagingBuffers, lse_reduce
from dcp_a2a.testing.data import partials
from tests.gpu._designs import GrowableWorkspace, PerCallAllocation

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
GROUP = Group(1, 0, None)  # one GPU: the exchange is the identity, the buffers are real


def _broken(design):
    return pytest.param(design, marks=pytest.mark.xfail(strict=True, raises=AssertionError,
                                                         reason="the design that shipped"))


def _capture(fn):
    # warm up (Triton compiles) outside the capture, on the stream the test allocates from, so
    # that memory the eager path frees is handed to the test's later allocations
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = fn()
    return g, res


def _eager(out, lse, **kw):
    return lse_reduce(out, lse, GROUP, buffers=StagingBuffers(), **kw)


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs"])
@pytest.mark.parametrize("design", [StagingBuffers, _broken(GrowableWorkspace)],
                         ids=lambda d: d.__name__)
def test_capture_then_eager_grow_then_replay(design, backend):
    """Incident 1: capture; an eager call with a larger batch grows the buffers; memory freed
    by the growth is handed to other tensors; replay must neither corrupt them nor misread."""
    bufs = design()
    outs, lses = partials(1, 8, 8, 128, torch.bfloat16, seed=1, device="cuda")
    g, res = _capture(lambda: lse_reduce(outs[0], lses[0], GROUP, buffers=bufs,
                                         return_lse=True, backend=backend))
    big_o, big_l = partials(1, 512, 8, 128, torch.bfloat16, seed=2, device="cuda")
    lse_reduce(big_o[0], big_l[0], GROUP, buffers=bufs, backend=backend)  # grows eager buffers
    torch.cuda.synchronize()
    # Take the freed blocks back with sentinels of every staging size (bytes): the caching
    # allocator hands a freed block to the next request of its size on the same stream.
    sizes = (8 * 8 * 130 * 2, 8 * 8 * 128 * 2, 8 * 8 * 4)
    fillers = [torch.full((n,), 3, dtype=torch.uint8, device="cuda") for n in sizes * 8]
    fresh_o, fresh_l = partials(1, 8, 8, 128, torch.bfloat16, seed=3, device="cuda")
    outs.copy_(fresh_o)
    lses.copy_(fresh_l)
    g.replay()
    torch.cuda.synchronize()
    want_out, want_lse = _eager(outs[0], lses[0], return_lse=True, backend=backend)
    assert all(torch.all(f == 3) for f in fillers), "replay wrote into memory it had freed"
    assert torch.equal(res[0], want_out) and torch.equal(res[1], want_lse)


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs"])
@pytest.mark.parametrize("design", [StagingBuffers, _broken(PerCallAllocation)],
                         ids=lambda d: d.__name__)
def test_many_graphs_one_pool_shuffled_replay(design, backend):
    """Incident 2: graphs for several batch sizes captured from one memory pool, each also
    holding a static buffer it allocates first (the next piece of a piecewise graph); replayed
    in shuffled order 1000 times, every graph's output and static buffer must stay intact."""
    bufs = design()
    pool = torch.cuda.graph_pool_handle()
    sizes = [1, 2, 4, 8, 16, 32]
    graphs = {}
    prev_staging_bytes = 0
    for b in sizes:
        outs, lses = partials(1, b, 8, 96, torch.float16, seed=b, device="cuda")
        fn = lambda o=outs[0], l=lses[0]: lse_reduce(o, l, GROUP, buffers=bufs, backend=backend)
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            # a static buffer as large as the previous graph's staging: if that memory went
            # back to the pool after its capture, this is where the pool puts it
            static = torch.empty(max(prev_staging_bytes, 1), dtype=torch.uint8, device="cuda")
            static.fill_(b)
            res = fn()
        prev_staging_bytes = b * 8 * (98 if backend == "packed" else 96) * 2
        graphs[b] = (g, res, _eager(outs[0], lses[0], backend=backend), static, (outs, lses))
    order = [sizes[i % len(sizes)] for i in range(1000)]
    random.Random(0).shuffle(order)
    for i, b in enumerate(order):
        graphs[b][0].replay()
        if i % 50 == 49 or i == len(order) - 1:
            torch.cuda.synchronize()
            for bb, (_, res, want, static, _) in graphs.items():
                assert torch.all(static == bb), f"graph B={bb}'s static buffer garbled"
                assert torch.equal(res, want), f"graph B={bb} garbled after {i + 1} replays"


def test_pinned_buffers_are_counted_and_released():
    bufs = StagingBuffers()
    outs, lses = partials(1, 4, 4, 64, torch.bfloat16, device="cuda")
    g, _ = _capture(lambda: lse_reduce(outs[0], lses[0], GROUP, buffers=bufs))
    assert bufs.pinned_for_graphs == 2
    del g
    bufs.release_captured()
    assert bufs.pinned_for_graphs == 0
