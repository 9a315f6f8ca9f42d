"""GPU tier: launches through a compiled kernel's launcher (dcp_a2a.kernels.launch) give the
bits of Triton's own dispatch, follow a change of address alignment, and replay under a CUDA
graph; and they are used at all (a Triton whose internals differ falls back silently, so the
count says whether the fast path still runs)."""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a import ops
from dcp_a2a.kernels import launch as direct
from dcp_a2a.testing.data import bits_view, partials

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
DEV = torch.device("cuda")


def _ops(dtype, b=5, n=4, hpr=3, d=72, offset=0, mask=False):
    """pack_send then unpack_combine of one rank's partial (the group of one's round trip at
    N ranks' wire layout); ``offset`` elements shift out's address off 16-byte alignment;
    ``mask``: every other request has no local KV (seq_lens and query_start_loc given)."""
    outs, lses = partials(n, b, n * hpr, d, dtype, seed=3)
    flat = torch.empty(offset + outs[0].numel(), dtype=dtype, device=DEV)
    out = flat[offset:].view(b, n * hpr, d)
    out.copy_(outs[0].to(DEV))
    lse = lses[0].to(DEV)
    p = dcp_a2a.lse_pack_dim(dtype)
    send = torch.full((n, b, hpr, d + p), float("nan"), dtype=dtype, device=DEV)

    idx = {}
    if mask:
        idx = dict(seq_lens=torch.tensor([7 * (i % 2) for i in range(b)], dtype=torch.int32,
                                         device=DEV),
                   query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=DEV))

    def run():
        dcp_a2a.pack_send(out, lse, send, n, hpr, d, p, **idx)
        return (send.clone(),) + dcp_a2a.unpack_combine(send, d, p, True, True)
    return run


def _through_triton(run):
    saved = {k: v.usable for k, v in direct._ALL.items()}
    for v in direct._ALL.values():
        v.usable = False
    try:
        return run()
    finally:
        for k, v in direct._ALL.items():
            v.usable = saved.get(k, v.usable)


def _same(a, b):
    return all(torch.equal(bits_view(x), bits_view(y)) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("offset,mask", [(0, False), (1, False), (0, True)],
                         ids=["aligned", "off_16_bytes", "masked"])
def test_direct_launches_give_triton_dispatch_bits(dtype, offset, mask):
    run = _ops(dtype, offset=offset, mask=mask)
    first = run()  # new keys: through Triton, kept
    before = sum(v.direct for v in direct._ALL.values())
    second = run()
    used = sum(v.direct for v in direct._ALL.values()) - before
    assert used >= 2, f"pack and combine did not launch directly ({used} direct launches)"
    assert _same(first, second) and _same(second, _through_triton(run))


def test_alignment_is_part_of_the_key():
    """A buffer at an address off 16 bytes after an aligned one of the same shape: Triton
    compiles another specialisation (no alignment hint), and so must the direct path not reuse
    the aligned one: results equal Triton's dispatch on the same inputs."""
    aligned, shifted = _ops(torch.bfloat16, b=7), _ops(torch.bfloat16, b=7, offset=1)
    aligned(), aligned()
    got = shifted()
    assert _same(got, _through_triton(shifted))


def test_direct_launches_replay_under_a_cuda_graph():
    run = _ops(torch.bfloat16, b=9)
    want = run()
    run()  # direct from here
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = run()
    for t in res:
        t.fill_(0)
    g.replay()
    torch.cuda.synchronize()
    assert _same(res, want)


@pytest.mark.parametrize("mask", [False, True], ids=["unmasked", "masked"])
def test_a_kept_problem_launches_through_its_site(mask):
    """The ops keep a checked problem (dcp_a2a.ops): from its second call on, pack_send and
    unpack_combine each launch through the kept Site, none through Triton's dispatch."""
    ops.forget_calls()
    run = _ops(torch.bfloat16, b=6, mask=mask)
    want = run()
    sites = [k.site for k in (*ops._PACK_CALLS.values(), *ops._UNPACK_CALLS.values())]
    assert len(sites) == 2 and all(s is not None for s in sites), sites
    before = sum(v.sited for v in direct._ALL.values())
    got = run()
    assert sum(v.sited for v in direct._ALL.values()) - before == 2, "not through the Sites"
    assert _same(got, want)


def test_a_kept_site_launches_the_tables_choice_after_an_override():
    """The bench times candidates under ``tuning.OVERRIDES``: a problem first seen under one
    must launch the table's kernel once the override is gone, not the candidate's."""
    from dcp_a2a.kernels import tuning
    ops.forget_calls()
    b, n, hpr, d = 64, 4, 8, 128
    recv = torch.zeros((n, b, hpr, d + 2), dtype=torch.bfloat16, device=DEV)
    table = tuning.combine_launch(n, b, hpr, d // 2)
    odd = tuning.Launch(1, 64, 8 if table.num_warps != 8 else 2)
    tuning.OVERRIDES["combine"] = odd
    try:
        dcp_a2a.unpack_combine(recv, d, 2, False, True)
    finally:
        tuning.OVERRIDES.pop("combine", None)
    dcp_a2a.unpack_combine(recv, d, 2, False, True)
    dcp_a2a.unpack_combine(recv, d, 2, False, True)
    (kept,) = ops._UNPACK_CALLS.values()
    assert kept.site is not None
    assert kept.site.compiled.metadata.num_warps == table.num_warps


@pytest.mark.parametrize("mask", [False, True], ids=["unmasked", "masked"])
def test_lse_reduce_launches_through_the_ops_kept_sites(mask):
    """lse_reduce (packed) packs and merges through the public ops: from a problem's second
    call on, both kernels launch through kept Sites (an eager call's host time), and
    the merge is the bits Triton's own dispatch gives."""
    ops.forget_calls()
    b, n, d = 6, 1, 72
    outs, lses = partials(n, b, 8, d, torch.bfloat16, seed=4)
    out, lse = outs[0].to(DEV), lses[0].to(DEV)
    idx = {}
    if mask:
        idx = dict(seq_lens=torch.tensor([5 * (i % 2) for i in range(b)], dtype=torch.int32,
                                         device=DEV),
                   query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=DEV))
    group = dcp_a2a.Group(1, 0, None)

    def run():
        return dcp_a2a.lse_reduce(out, lse, group, return_lse=True, **idx)
    want = _through_triton(run)
    run()  # checked, kept
    before = sum(v.sited for v in direct._ALL.values())
    got = run()
    assert sum(v.sited for v in direct._ALL.values()) - before == 2, "not through the Sites"
    assert _same(got, want)
