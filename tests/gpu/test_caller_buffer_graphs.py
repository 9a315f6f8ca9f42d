"""A captured call writes into the caller's buffer on every replay: lse_reduce(into=...) on each
backend (a mirror group of 2 on one GPU, and symm_mem's in-process tables), with and without
the up-projection, captured in a CUDA graph, replayed on new inputs: the buffer holds eager's
bits for those inputs, and nothing is allocated for the result."""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a import Group
from dcp_a2a.testing.data import bits_view, partials
from dcp_a2a.testing.mirror import MirrorGroup

pytestmark = pytest.mark.gpu

N, B, H, L, V = 2, 16, 8, 64, 24


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs"])
@pytest.mark.parametrize("order", [None, "before_exchange", "after_merge"])
def test_replays_write_the_callers_buffer(backend, order):
    group = Group(N, 1, MirrorGroup(N, 1))
    outs, lses = partials(1, B, H, L, torch.bfloat16, seed=1, device="cuda")
    out, lse = outs[0].clone(), lses[0].clone()
    w = (torch.randn(H, L, V, device="cuda") / 8).to(torch.bfloat16)
    kw = dict(backend=backend, return_lse=True)
    if order is not None:
        kw.update(w_uv=w, up_proj=order)
    width = L if order is None else V
    into = torch.empty(B, width, H // N, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            dcp_a2a.lse_reduce(out, lse, group, into=into, **kw)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res, res_lse = dcp_a2a.lse_reduce(out, lse, group, into=into, **kw)
    assert res is into
    for seed in (5, 6):
        new_outs, new_lses = partials(1, B, H, L, torch.bfloat16, seed=seed, device="cuda")
        out.copy_(new_outs[0])
        lse.copy_(new_lses[0])
        into.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want, want_lse = dcp_a2a.lse_reduce(new_outs[0], new_lses[0], group, **kw)
        assert torch.equal(bits_view(into.contiguous()), bits_view(want))
        assert torch.equal(res_lse, want_lse)


def test_no_allocation_for_the_result():
    """With into, a kept eager call of unpack_combine allocates nothing for its output (the
    caching allocator's count of allocations does not move; without into it does)."""
    outs, lses = partials(N, B, H, L, torch.bfloat16, seed=2, device="cuda")
    p = dcp_a2a.lse_pack_dim(torch.bfloat16)
    send = torch.empty(N, B, H // N, L + p, dtype=torch.bfloat16, device="cuda")
    dcp_a2a.pack_send(outs[0], lses[0], send, N, H // N, L, p)
    into = torch.empty(B, H // N, L, dtype=torch.bfloat16, device="cuda")
    for _ in range(2):
        dcp_a2a.unpack_combine(send, L, p, False, True, into=into)
        dcp_a2a.unpack_combine(send, L, p, False, True)
    torch.cuda.synchronize()

    def allocations():
        return torch.cuda.memory_stats()["allocation.all.allocated"]

    before = allocations()
    dcp_a2a.unpack_combine(send, L, p, False, True, into=into)
    assert allocations() == before
    dcp_a2a.unpack_combine(send, L, p, False, True)
    assert allocations() == before + 1
