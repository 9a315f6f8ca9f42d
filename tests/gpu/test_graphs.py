"""GPU tier: staging buffers under CUDA graphs. One test per incident that shipped elsewhere;
each runs on the project's StagingBuffers (must pass), on designs that are legal under
PyTorch's rules (must pass too: the test must not fail correct code) and on the design that
broke (must fail, xfail strict: if the broken design ever passes, the test has lost its
power)."""

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
@pytest.mark.parametrize("design", [StagingBuffers, PerCallAllocation, _broken(GrowableWorkspace)],
                         ids=lambda d: d.__name__)
def test_many_graphs_one_pool_shuffled_replay(design, backend):
    """Incident 2, in the terms of PyTorch's rule for graphs sharing a pool: graphs for several
    batch sizes captured from one pool (one per batch size, as engines capture them) and
    replayed in shuffled order 1000 times. A capture's freed memory may be taken by graphs
    captured after it, so a graph's output is promised only until another graph of the pool
    replays: each is read right after its own replay, and must also survive the replay of a
    graph captured after it (its output is live, no later capture can take it). Per-call
    allocation is legal under that rule and must pass. The design that shipped kept the staging
    it handed to the graphs in a shared, growable workspace: a later, larger call freed it to
    the eager allocator, live tensors took it, and every replay wrote into them."""
    bufs = design()
    pool = torch.cuda.graph_pool_handle()
    sizes = [1, 2, 4, 8, 16, 32]
    graphs = []
    for b in sizes:
        outs, lses = partials(1, b, 8, 96, torch.float16, seed=b, device="cuda")
        fn = lambda o=outs[0], l=lses[0]: lse_reduce(o, l, GROUP, buffers=bufs, backend=backend)
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            res = fn()
        graphs.append((b, g, res, _eager(outs[0], lses[0], backend=backend), (outs, lses)))
    torch.cuda.synchronize()
    # live tensors of every staging size, on the memory the captures' eager calls freed
    staging = [b * 8 * w for b in sizes for w in (98 * 2, 96 * 2, 4)]
    fillers = [torch.full((n,), 7, dtype=torch.uint8, device="cuda") for n in staging * 4]
    order = [i % len(sizes) for i in range(1000)]
    random.Random(0).shuffle(order)
    for i, k in enumerate(order):
        b, g, res, want, _ = graphs[k]
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(res, want), f"graph B={b} wrong right after replay {i + 1}"
        if k + 1 < len(graphs) and i % 10 == 0:
            later = graphs[k + 1 + i % (len(graphs) - k - 1)]
            later[1].replay()
            torch.cuda.synchronize()
            assert torch.equal(later[2], later[3]), f"graph B={later[0]} wrong after replay"
            assert torch.equal(res, want), (f"graph B={b}'s output garbled by the replay of "
                                            f"graph B={later[0]}, captured after it")
    assert all(torch.all(f == 7) for f in fillers), "a replay wrote into live tensors' memory"


def test_pinned_buffers_are_counted_and_released():
    bufs = StagingBuffers()
    outs, lses = partials(1, 4, 4, 64, torch.bfloat16, device="cuda")
    g, _ = _capture(lambda: lse_reduce(outs[0], lses[0], GROUP, buffers=bufs))
    assert bufs.pinned_for_graphs == 2
    del g
    bufs.release_captured()
    assert bufs.pinned_for_graphs == 0
