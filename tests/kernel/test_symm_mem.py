"""The direct (symm_mem) kernels in one process: N ranks' buffers on one device, each rank's
pointer tables pointing at the others' (``SymmMemBuffers.in_process``), so the pack-to-peers
and wait-then-combine kernels run their own layout, slot and signal arithmetic on the CPU
interpreter and compiled on a GPU. Real ranks (NCCL, racing ranks, graphs): tests/multiproc/
test_symm_mem.py."""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a.inprocess import lse_reduce_in_process
from dcp_a2a.symm_mem import SymmMemBuffers
from dcp_a2a.testing.data import bits_view, partials
from dcp_a2a.testing.groups import masked_partials

pytestmark = pytest.mark.kernel


def _same(a, b):
    return a.shape == b.shape and bool(torch.equal(bits_view(a.contiguous()),
                                                   bits_view(b.contiguous())))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("n,d", [(2, 64), (3, 7)], ids=["N2-D64", "N3-D7"])
def test_bitwise_equal_to_packed(device, dtype, n, d):
    """Both bases, with and without empty-shard masks; D=7 is odd (no paired lanes)."""
    for base_e in (True, False):
        outs, lses = partials(n, 3, 2 * n, d, dtype, seed=d + n)
        outs, lses = list(outs.to(device)), list(lses.to(device))
        want = lse_reduce_in_process(outs, lses, return_lse=True, is_lse_base_on_e=base_e)
        got = lse_reduce_in_process(outs, lses, return_lse=True, is_lse_base_on_e=base_e,
                                    backend="symm_mem")
        for r in range(n):
            assert _same(got[r][0], want[r][0]) and _same(got[r][1], want[r][1]), (r, base_e)
    outs, lses, _, seq_lens, qsl = masked_partials(n, dtype, seed=5, d=d)
    kw = dict(return_lse=True, seq_lens=[s.to(device) for s in seq_lens],
              query_start_loc=qsl.to(device))
    outs, lses = list(outs.to(device)), list(lses.to(device))
    want = lse_reduce_in_process(outs, lses, **kw)
    got = lse_reduce_in_process(outs, lses, backend="symm_mem", **kw)
    for r in range(n):
        assert _same(got[r][0], want[r][0]) and _same(got[r][1], want[r][1]), r


def test_calls_alternate_slots_and_keep_state(device):
    """Buffers reused across calls of different sizes: each call's result is its own (the
    epoch, the counter and the flags carry over; B may shrink and grow up to max_tokens)."""
    n, h, d = 2, 4, 16
    bufs = SymmMemBuffers.in_process(n, max_tokens=5, num_heads=h, head_dim=d,
                                     dtype=torch.bfloat16, device=device)
    for call, b in enumerate((5, 1, 3, 5)):
        outs, lses = partials(n, b, h, d, torch.bfloat16, seed=call)
        outs, lses = list(outs.to(device)), list(lses.to(device))
        want = lse_reduce_in_process(outs, lses, return_lse=True)
        got = lse_reduce_in_process(outs, lses, return_lse=True, backend="symm_mem",
                                    buffers=bufs)
        for r in range(n):
            assert _same(got[r][0], want[r][0]) and _same(got[r][1], want[r][1]), (call, r)
    for r, buf in enumerate(bufs):
        t = buf.tables
        assert int(t.epoch) == 4 and int(t.counter) == 0  # one epoch a call, counter reset
        assert t.flags.tolist() == [4] * n  # every peer delivered every call


def test_empty_batch_signals_nothing(device):
    bufs = SymmMemBuffers.in_process(2, max_tokens=2, num_heads=4, head_dim=8,
                                     dtype=torch.float16, device=device)
    outs, lses = partials(2, 0, 4, 8, torch.float16, seed=0)
    got = lse_reduce_in_process(list(outs.to(device)), list(lses.to(device)), return_lse=True,
                                backend="symm_mem", buffers=bufs)
    assert [tuple(o.shape) for o, _ in got] == [(0, 2, 8)] * 2
    assert all(int(b.tables.epoch) == 0 and b.tables.flags.tolist() == [0, 0] for b in bufs)


@pytest.mark.parametrize("what,call,match", [
    ("too many rows", dict(b=3), r"B=3 token rows .* max_tokens=2"),
    ("other head dim", dict(b=1, d=16), r"head_dim=8.*D=16"),
    ("other heads", dict(b=1, h=8), r"num_heads=4.*H=8"),
    ("other dtype", dict(b=1, dtype=torch.float16), r"torch.bfloat16.*torch.float16"),
])
def test_calls_that_do_not_fit_are_refused(device, what, call, match):
    b, h, d, dtype = call.get("b", 1), call.get("h", 4), call.get("d", 8), \
        call.get("dtype", torch.bfloat16)
    bufs = SymmMemBuffers.in_process(2, max_tokens=2, num_heads=4, head_dim=8,
                                     dtype=torch.bfloat16, device=device)
    out = torch.randn(b, h, d, device=device).to(dtype)
    lse = torch.randn(b, h, device=device)
    with pytest.raises(ValueError, match=match):
        dcp_a2a.lse_reduce_steps(out, lse, 2, 0, backend="symm_mem", buffers=bufs[0])


def test_wrong_buffers_and_rank_are_refused(device):
    bufs = SymmMemBuffers.in_process(2, max_tokens=2, num_heads=4, head_dim=8,
                                     dtype=torch.bfloat16, device=device)
    out = torch.randn(1, 4, 8, device=device).bfloat16()
    lse = torch.randn(1, 4, device=device)
    with pytest.raises(ValueError, match="needs buffers=SymmMemBuffers"):
        dcp_a2a.lse_reduce_steps(out, lse, 2, 0, backend="symm_mem")
    with pytest.raises(ValueError, match="needs buffers=SymmMemBuffers"):
        dcp_a2a.lse_reduce_steps(out, lse, 2, 0, backend="symm_mem",
                                 buffers=dcp_a2a.StagingBuffers())
    with pytest.raises(TypeError, match="takes buffers=StagingBuffers"):
        dcp_a2a.lse_reduce_steps(out, lse, 2, 0, backend="packed", buffers=bufs[0])
    with pytest.raises(ValueError, match="made for rank 1 of 2, but the call is rank 0 of 2"):
        dcp_a2a.lse_reduce_steps(out, lse, 2, 0, backend="symm_mem", buffers=bufs[1])


def test_input_inside_the_receive_buffer_is_refused(device):
    """The staging must never alias what it packs (a shipped engine's corruption)."""
    bufs = SymmMemBuffers.in_process(2, max_tokens=2, num_heads=4, head_dim=8,
                                     dtype=torch.bfloat16, device=device)
    out = bufs[0].tables.recv[:32].view(1, 4, 8)
    lse = torch.zeros(1, 4, device=device)
    with pytest.raises(ValueError, match="symm_mem receive buffer overlaps out"):
        dcp_a2a.lse_reduce_steps(out, lse, 2, 0, backend="symm_mem", buffers=bufs[0])


def test_bad_sizes_are_refused(device):
    with pytest.raises(ValueError, match="not divisible by the DCP world size"):
        SymmMemBuffers.in_process(3, max_tokens=2, num_heads=4, head_dim=8,
                                  dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        SymmMemBuffers.in_process(2, max_tokens=0, num_heads=4, head_dim=8,
                                  dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="float8"):
        SymmMemBuffers.in_process(2, max_tokens=1, num_heads=4, head_dim=8,
                                  dtype=torch.float8_e4m3fn, device=device)


def test_real_buffers_need_cuda():
    group = dcp_a2a.Group(1, 0, None)
    with pytest.raises(ValueError, match="backend='symm_mem' needs CUDA devices"):
        SymmMemBuffers(group, max_tokens=1, num_heads=2, head_dim=8, dtype=torch.bfloat16,
                       device="cpu")
