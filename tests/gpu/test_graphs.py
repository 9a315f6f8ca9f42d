"""GPU tier: staging buffers under CUDA graphs. One test per incident that shipped elsewhere;
each runs on the project's StagingBuffers (must pass) and on the design that broke (must fail,
xfail strict: if the broken design ever passes, the test has lost its power)."""

from __future__ import annotations

import random

import pytest
import torch

from dcp_a2a import Group, StagingBuffers, lse_reduce
from tests._data import partials
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
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (Triton compiles) outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(s)
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
    # Take the freed blocks back with sentinels (same sizes as the small staging buffers).
    fillers = [torch.full((n,), 3.0, dtype=torch.bfloat16, device="cuda")
               for n in (8 * 8 * 130, 8 * 8 * 128, 8 * 8 * 130, 8 * 8 * 128) * 4]
    fresh_o, fresh_l = partials(1, 8, 8, 128, torch.bfloat16, seed=3, device="cuda")
    outs.copy_(fresh_o)
    lses.copy_(fresh_l)
    g.replay()
    torch.cuda.synchronize()
    want_out, want_lse = _eager(outs[0], lses[0], return_lse=True, backend=backend)
    assert all(torch.all(f == 3.0) for f in fillers), "replay wrote into memory it had freed"
    assert torch.equal(res[0], want_out) and torch.equal(res[1], want_lse)


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs"])
@pytest.mark.parametrize("design", [StagingBuffers, _broken(PerCallAllocation)],
                         ids=lambda d: d.__name__)
def test_many_graphs_one_pool_shuffled_replay(design, backend):
    """Incident 2: graphs for several batch sizes captured from one memory pool, replayed in
    shuffled order 1000 times; every graph's output must stay equal to the eager result."""
    bufs = design()
    pool = torch.cuda.graph_pool_handle()
    sizes = [1, 2, 4, 8, 16, 32]
    graphs = {}
    for b in sizes:
        outs, lses = partials(1, b, 8, 96, torch.float16, seed=b, device="cuda")
        fn = lambda o=outs[0], l=lses[0]: lse_reduce(o, l, GROUP, buffers=bufs, backend=backend)
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            res = fn()
        graphs[b] = (g, res, _eager(outs[0], lses[0], backend=backend))
    order = [sizes[i % len(sizes)] for i in range(1000)]
    random.Random(0).shuffle(order)
    for i, b in enumerate(order):
        graphs[b][0].replay()
        if i % 50 == 49 or i == len(order) - 1:
            torch.cuda.synchronize()
            for bb, (_, res, want) in graphs.items():
                assert torch.equal(res, want), f"graph B={bb} garbled after {i + 1} replays"


def test_pinned_buffers_are_counted_and_released():
    bufs = StagingBuffers()
    outs, lses = partials(1, 4, 4, 64, torch.bfloat16, device="cuda")
    g, _ = _capture(lambda: lse_reduce(outs[0], lses[0], GROUP, buffers=bufs))
    assert bufs.pinned_for_graphs == 2
    del g
    bufs.release_captured()
    assert bufs.pinned_for_graphs == 0
