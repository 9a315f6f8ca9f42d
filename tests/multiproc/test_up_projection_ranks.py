"""The up-projection, the caller's buffer and the compiled exchange on real gloo ranks (the
pool's 2- and 3-rank groups): every rank's result within the bound of its order, written into
its buffer; ``torch.compile`` of ``lse_reduce`` (its exchange torch's functional
all_to_all_single) bitwise equal to the eager call."""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.testing.compare_projection import check_up_projection
from dcp_a2a.testing.data import bits_view, heads_of, partials

pytestmark = pytest.mark.multiproc

ORDERS = ("before_exchange", "after_merge")


def _projected_task(ctx, n, w, out, lse):
    """Eager lse_reduce(w_uv=w) in both orders, each into a strided buffer of the caller's."""
    import dcp_a2a

    group = ctx.group(n)
    out, lse, w = out.to(ctx.device), lse.to(ctx.device), w.to(ctx.device)
    res = {}
    for order in ORDERS:
        frame = torch.full((out.shape[0], out.shape[1] // n, w.shape[2] + 1), math.nan,
                           dtype=out.dtype, device=ctx.device)
        into = frame[..., 1:]
        got = dcp_a2a.lse_reduce(out, lse, group, w_uv=w, up_proj=order, into=into,
                                 return_lse=True)
        res[order] = dict(is_into=got[0] is into, out=into.cpu().clone(), lse=got[1].cpu(),
                          border=frame[..., 0].cpu().clone())
    return res


def _compiled_task(ctx, n, w, out, lse):
    """The same calls compiled (aot_eager: the Triton interpreter's kernels on CPU ranks) and
    eager; returns both results and whether the graph held the functional collective."""
    import dcp_a2a

    group = ctx.group(n)
    out, lse, w = out.to(ctx.device), lse.to(ctx.device), w.to(ctx.device)
    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        from torch._dynamo.backends.common import aot_autograd
        from functorch.compile import make_boxed_func

        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward))(
            gm, example_inputs)

    def f(out, lse):
        return (dcp_a2a.lse_reduce(out, lse, group, return_lse=True),
                dcp_a2a.lse_reduce(out, lse, group, w_uv=w, up_proj="before_exchange"),
                dcp_a2a.lse_reduce(out, lse, group, w_uv=w, up_proj="after_merge"))

    eager = f(out, lse)
    compiled = torch.compile(f, fullgraph=True, backend=backend)(out, lse)
    flat = lambda r: [r[0][0], r[0][1], r[1], r[2]]  # noqa: E731
    return dict(eager=[t.cpu() for t in flat(eager)], compiled=[t.cpu() for t in flat(compiled)],
                ops=ops)


@pytest.mark.parametrize("n", [2, 3])
def test_up_projection_into_the_callers_buffer_on_real_ranks(rank_pool, n):
    b, h, lat, v = 3, 2 * n, 24, 12
    outs, lses = partials(n, b, h, lat, torch.bfloat16, seed=n)
    w = (torch.randn(h, lat, v, generator=torch.Generator().manual_seed(n)) / 5).to(
        torch.bfloat16)
    results = rank_pool.run(_projected_task, n, w, per_rank=[(outs[r], lses[r])
                                                               for r in range(n)], n=n)
    for r, res in enumerate(results):
        for order in ORDERS:
            got = res[order]
            assert got["is_into"], f"rank {r}, {order}: into was not returned"
            assert torch.isnan(got["border"]).all(), f"rank {r}: written outside into"
            rep = check_up_projection(got["out"], got["lse"], outs, lses, w, order=order,
                                      heads=heads_of(r, n, h))
            assert rep.ok, f"rank {r}, {order}:\n{rep.describe()}"


def test_compiled_lse_reduce_is_the_eager_one_on_real_ranks(rank_pool):
    """fullgraph compile on 2 gloo ranks: the graph holds dcp_a2a's ops around
    _c10d_functional.all_to_all_single, and its results are the eager call's bits."""
    n, b, h, lat, v = 2, 2, 4, 16, 8
    outs, lses = partials(n, b, h, lat, torch.float16, seed=7)
    w = (torch.randn(h, lat, v, generator=torch.Generator().manual_seed(7)) / 4).to(
        torch.float16)
    results = rank_pool.run(_compiled_task, n, w, per_rank=[(outs[r], lses[r])
                                                              for r in range(n)], n=n,
                            timeout=600)
    for r, res in enumerate(results):
        assert any("all_to_all_single" in op for op in res["ops"]), res["ops"]
        assert any("dcp_a2a.pack_send" in op for op in res["ops"]), res["ops"]
        for i, (c, e) in enumerate(zip(res["compiled"], res["eager"])):
            assert torch.equal(bits_view(c), bits_view(e)), f"rank {r}, result {i}"
