"""Conformance: MLA's up-projection around the exchange, ``lse_reduce(out, lse, group,
w_uv=W)`` with the latent partial ``out[B, H, L]`` and ``W[H, L, V]`` (per head): every rank
gets its heads of the merge of all ranks' partials, projected by their W, ``[B, H/N, V]``.

Either order is allowed (tolerances.yaml ``up_projection``): project before the exchange
(each rank projects its partial; the exchange carries V + P lanes a head) or after the merge
(the exchange carries the latent L + P lanes; each rank projects its own heads). Which one an
implementation took is read off the bytes its collectives carried (a rank's collectives, all
together, carry (lanes + P) values a row and head: the packed wire, or the output and LSE
apart, or an all-gather of LSEs and a reduce-scatter of outputs), and its result is judged by
that order's bound against the float64 oracle (merge, then project). The switch between them
must be a threshold in B: an implementation that projects first at some batch size does so at
every larger one (projecting first trades reading all of W for fewer bytes a token; more
tokens never make that trade worse).

Ranks with different partials run one after another in this process
(:mod:`dcp_a2a.testing.replaygroup`); the threshold scan runs one rank of a group whose ranks
all hold the same partial (:class:`~dcp_a2a.testing.mirror.MirrorGroup`).
"""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a import Group
from dcp_a2a.testing.compare_projection import (WEAKER_PROJECTIONS, check_up_projection,
                                                projection_bounds, weaker_projection)
from dcp_a2a.testing.conformance._refusals import TripwireGroup, refused
from dcp_a2a.testing.data import assert_unmodified, heads_of, partials, snapshot
from dcp_a2a.testing.mirror import MirrorGroup
from dcp_a2a.testing.replaygroup import ReplayGroup, run_ranks
from dcp_a2a.testing.verdicts import Precision

pytestmark = [pytest.mark.kernel, pytest.mark.conformance, pytest.mark.clause("up-projection"),
              pytest.mark.needs("lse_reduce")]

ORDERS = ("before_exchange", "after_merge")


def _weights_uv(h, lat, v, dtype, *, seed=0, device="cpu"):
    """W_UV[H, L, V] in ``dtype``: every head's its own (a wrong head's W is O(1) off)."""
    g = torch.Generator().manual_seed(1000 + seed)
    return (torch.randn(h, lat, v, generator=g) / math.sqrt(lat)).to(dtype).to(device)


def _lanes_a_head(log, b, h, dtype) -> float:
    """The lanes a (row, head) that one rank's collectives carried, the LSE's 4 bytes left
    out: (all bytes sent) / (B H element size) - 4 / element size."""
    e = torch.empty((), dtype=dtype).element_size()
    return sum(s.nbytes for s in log) / (b * h * e) - 4 / e


def order_of(log, b, h, lat, v, dtype) -> str:
    """The order an implementation took, from the bytes one rank's collectives carried."""
    lanes = _lanes_a_head(log, b, h, dtype)
    if lanes == v:
        return "before_exchange"
    if lanes == lat:
        return "after_merge"
    raise AssertionError(
        f"the exchange carried {lanes:g} lanes a head besides the LSE's 4 bytes "
        f"({[(s.kind, s.shape, s.nbytes) for s in log]}): neither the value width V={v} "
        f"(projected before the exchange) nor the latent L={lat} (projected after the merge)")


def _record(request, rep, impl):
    import os

    from dcp_a2a.testing.impl import ENV_VAR

    request.node.user_properties.append(
        ("merge_report", rep.as_dict() | {"subject": os.environ.get(ENV_VAR, impl.spec)}))


def _check_ranks(request, impl, results, logs, outs, lses, w, *, base_e, return_lse, n):
    """Every rank's result within the bound of the order its bytes show."""
    _, b, h, lat = outs.shape
    v = w.shape[2]
    orders = {order_of(log, b, h, lat, v, outs.dtype) for log in logs}
    assert len(orders) == 1, f"the ranks took different orders: {orders}"
    order = orders.pop()
    for r, res in enumerate(results):
        out, lse = res if return_lse else (res, None)
        assert out.dtype == outs.dtype, f"rank {r}: output dtype {out.dtype} != {outs.dtype}"
        assert tuple(out.shape) == (b, h // n, v), f"rank {r}: output shape {tuple(out.shape)}"
        # on the partials' device (the float64 oracle of DeepSeek-V3's shapes: the GPU's)
        rep = check_up_projection(out.to(outs.device), None if lse is None else lse, outs,
                                  lses, w.to(outs.device), order=order,
                                  is_lse_base_on_e=base_e, heads=heads_of(r, n, h))
        _record(request, rep, impl)
        if not rep.ok:
            weaker = weaker_projection(out.to(outs.device), lse, outs, lses, w.to(outs.device),
                                       order=order, is_lse_base_on_e=base_e,
                                       heads=heads_of(r, n, h))
            if weaker is not None:  # right numbers, a known less precise design
                raise Precision(f"rank {r}, {order}:\n{rep.describe()}\nweaker precision: "
                                f"{rep.worst_ratio:.3g}x the derived bound, within the bound "
                                f"of a {WEAKER_PROJECTIONS[weaker][2]}")
        assert rep.ok, f"rank {r}, {order}:\n{rep.describe()}"
    return order


def _reduce_all(impl, outs, lses, w, **kw):
    """Every rank's lse_reduce(w_uv=w) and every rank's log of collectives."""
    before = snapshot(w=w, outs=outs, lses=lses)

    def call(group):
        r = group.rank_in_group
        return impl.lse_reduce(outs[r], lses[r], group, w_uv=w, **kw)

    results, logs = run_ranks(outs.shape[0], call)
    assert_unmodified(before, "lse_reduce(w_uv=...)")
    return results, logs


@pytest.mark.parametrize("dtype,base_e", [(torch.float16, True), (torch.bfloat16, False),
                                          (torch.float32, True)],
                         ids=["float16-base_e", "bfloat16-base_2", "float32-base_e"])
@pytest.mark.parametrize("b", [1, 12])
def test_merged_and_projected_within_the_bound_of_the_order_taken(impl, device, request, dtype,
                                                                 base_e, b):
    """N = 3 ranks of different partials, V not a power of two where the implementation takes
    any head width; B = 1 and 12 (vLLM switches at 8)."""
    env = impl.envelope
    env.require(base_e=base_e)
    n, h, lat, v = 3, 6, env.fit_head_dim(32), env.fit_head_dim(20)
    outs, lses = partials(n, b, h, lat, dtype, seed=b + 7 * int(base_e), device=device)
    w = _weights_uv(h, lat, v, dtype, seed=b, device=device)
    results, logs = _reduce_all(impl, outs, lses, w, is_lse_base_on_e=base_e)
    _check_ranks(request, impl, results, logs, outs, lses, w, base_e=base_e, return_lse=False,
                 n=n)


@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_returned_lse_is_the_merged_lse(impl, device, request, base_e):
    impl.envelope.require(base_e=base_e)
    n, b, h, lat, v = 2, 3, 4, impl.envelope.fit_head_dim(16), impl.envelope.fit_head_dim(8)
    outs, lses = partials(n, b, h, lat, torch.bfloat16, seed=4, device=device)
    w = _weights_uv(h, lat, v, torch.bfloat16, device=device)
    results, logs = _reduce_all(impl, outs, lses, w, is_lse_base_on_e=base_e, return_lse=True)
    for out, lse in results:
        assert lse.dtype == torch.float32 and tuple(lse.shape) == (b, h // n)
    _check_ranks(request, impl, results, logs, outs, lses, w, base_e=base_e, return_lse=True,
                 n=n)


def _deepseek_v3(impl, device, request, n, b):
    h, lat, v = 128, 512, 128
    outs, lses = partials(n, b, h, lat, torch.bfloat16, seed=b, device=device)
    w = _weights_uv(h, lat, v, torch.bfloat16, seed=b, device=device)
    results, logs = _reduce_all(impl, outs, lses, w)
    _check_ranks(request, impl, results, logs, outs, lses, w, base_e=True, return_lse=False, n=n)


def test_deepseek_v3_shapes(impl, device, request):
    """H = 128 heads, L = 512, V = 128 (DeepSeek-V3's MLA), bfloat16, one token on 2 ranks
    (the CPU's interpreter takes seconds a call at these shapes; the GPU runs more)."""
    _deepseek_v3(impl, device, request, 2, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("b", [1, 16, 64, 256])
def test_deepseek_v3_shapes_on_the_gpu(impl, device, request, n, b):
    """DeepSeek-V3's shapes at DCP 4 and 8 and 1 to 256 tokens: both sides of any switch
    point in that range."""
    if device.type != "cuda":
        pytest.skip("compiled kernels only: the interpreter takes seconds a call here")
    _deepseek_v3(impl, device, request, n, b)


@pytest.mark.parametrize("case", ["zero_partial", "empty_shard", "all_ranks_empty",
                                  "one_rank_only"])
def test_awkward_partials(impl, device, request, case):
    """A zero partial; a rank with nothing for some rows (LSE -inf, a NaN partial that must not
    leak through the projection); rows where every rank is empty (0, and LSE -inf); a row where
    one rank alone has weight (exactly its projected partial's merge)."""
    env = impl.envelope
    n, b, h, lat, v = 3, 4, 3, env.fit_head_dim(24), env.fit_head_dim(10)
    outs, lses = partials(n, b, h, lat, torch.float32, seed=11, device=device)
    outs, lses = outs.clone(), lses.clone()
    if case == "zero_partial":
        outs[1] = 0.0
    elif case == "empty_shard":
        lses[2, 1:3] = -math.inf
        outs[2, 1:3] = math.nan
    elif case == "all_ranks_empty":
        lses[:, 2] = -math.inf
        outs[:, 2] = math.nan
    else:
        lses[1:, 0] = -math.inf
        outs[1:, 0] = math.nan
    w = _weights_uv(h, lat, v, torch.float32, device=device)
    results, logs = _reduce_all(impl, outs, lses, w, return_lse=True)
    for out, lse in results:
        assert not torch.isnan(out).any(), "a NaN partial of a rank of weight 0 leaked"
        if case == "all_ranks_empty":
            assert torch.all(out[2].cpu() == 0) and torch.all(lse[2].cpu() == -math.inf)
    _check_ranks(request, impl, results, logs, outs, lses, w, base_e=True, return_lse=True, n=n)


@pytest.mark.surface("up-projection", "masking")
def test_masked_rows_with_the_up_projection(impl, device, request):
    """seq_lens / query_start_loc with w_uv: a rank's request without local KV (its NaN partial
    never reaches the result) and padding rows (0, and LSE -inf)."""
    env = impl.envelope
    n, b, h, lat, v = 2, 5, 4, env.fit_head_dim(16), env.fit_head_dim(12)
    outs, lses = partials(n, b, h, lat, torch.bfloat16, seed=2, device=device)
    outs, lses = outs.clone(), lses.clone()
    qsl = torch.tensor([0, 2, 4], dtype=torch.int32, device=device)  # row 4: padding
    seq_lens = [torch.tensor([3, 3], dtype=torch.int32, device=device),
                torch.tensor([3, 0], dtype=torch.int32, device=device)]
    outs[1, 2:4] = math.nan
    lses[1, 2:4] = 1e30  # garbage that would dominate if unmasked
    w = _weights_uv(h, lat, v, torch.bfloat16, device=device)

    def call(group):
        r = group.rank_in_group
        return impl.lse_reduce(outs[r], lses[r], group, w_uv=w, return_lse=True,
                               seq_lens=seq_lens[r], query_start_loc=qsl)

    results, logs = run_ranks(n, call)
    effective = lses.clone()
    effective[1, 2:4] = -math.inf
    effective[:, 4] = -math.inf
    for out, lse in results:
        assert torch.all(out[4].cpu() == 0) and torch.all(lse[4].cpu() == -math.inf)
    _check_ranks(request, impl, results, logs, outs, effective, w, base_e=True, return_lse=True,
                 n=n)


def test_group_of_one(impl, device, request):
    """N = 1: no exchange (no order to read off the wire); the result is the partial projected
    by W, within the bound of one of the orders."""
    env = impl.envelope
    env.require(world_size=1)
    b, h, lat, v = 3, 2, env.fit_head_dim(16), env.fit_head_dim(12)
    outs, lses = partials(1, b, h, lat, torch.float16, seed=5, device=device)
    w = _weights_uv(h, lat, v, torch.float16, device=device)
    out = impl.lse_reduce(outs[0], lses[0], Group(1, 0, None), w_uv=w)
    reps = [check_up_projection(out.cpu(), None, outs.cpu(), lses.cpu(), w.cpu(), order=o)
            for o in ORDERS]
    _record(request, min(reps, key=lambda r: r.worst_ratio), impl)
    assert any(r.ok for r in reps), "\n".join(r.describe() for r in reps)


class _Recording(MirrorGroup):
    """A group of ranks that all hold the same partial, logging what each collective carried."""

    def __init__(self, size, rank):
        super().__init__(size, rank)
        self.log = []

    def _note(self, kind, t):
        from dcp_a2a.testing.replaygroup import Sent

        self.log.append(Sent(kind, t.dtype, tuple(t.shape), t.numel() * t.element_size()))

    def all_to_all_single(self, output, input, *a, **k):
        self._note("all_to_all_single", input)
        return super().all_to_all_single(output, input, *a, **k)

    def all_gather_single(self, output, input, *a, **k):
        self._note("all_gather", input)
        return super().all_gather_single(output, input, *a, **k)

    def reduce_scatter_single(self, output, input, *a, **k):
        self._note("reduce_scatter", input)
        return super().reduce_scatter_single(output, input, *a, **k)


SCAN = (1, 2, 4, 6, 8, 9, 12, 16, 32, 64, 128)


def test_the_switch_is_a_threshold_and_each_order_carries_its_lanes(impl, device, request):
    """B from 1 to 128 (rank 1 of 2 ranks that hold the same partial): every call's
    collectives carry V + P lanes a head (projected first) or L + P (merged first), and once
    the implementation projects first it does so at every larger B; each result within the
    bound of its order (heads [H/2, H) projected by their own W)."""
    env = impl.envelope
    n, r, h, lat, v = 2, 1, 4, env.fit_head_dim(32), env.fit_head_dim(16)
    w = _weights_uv(h, lat, v, torch.bfloat16, device=device)
    seen = []
    for b in SCAN:
        outs, lses = partials(1, b, h, lat, torch.bfloat16, seed=b, device=device)
        pg = _Recording(n, r)
        out = impl.lse_reduce(outs[0], lses[0], Group(n, r, pg), w_uv=w)
        order = order_of(pg.log, b, h, lat, v, torch.bfloat16)
        seen.append((b, order))
        every = outs.expand(n, -1, -1, -1)  # each rank's partial: the same
        rep = check_up_projection(out.cpu(), None, every.cpu(), lses.expand(n, -1, -1).cpu(),
                                  w.cpu(), order=order, heads=heads_of(r, n, h))
        assert rep.ok, f"B={b}, {order}:\n{rep.describe()}"
    first = [b for b, o in seen if o == "before_exchange"]
    later_merged = [b for b, o in seen if o == "after_merge" and first and b > first[0]]
    assert not later_merged, (
        f"projected before the exchange at B={first[0]} but after the merge at the larger "
        f"B={later_merged}: the switch is not a threshold (orders by B: {seen})")


@pytest.mark.clause("bad input")
@pytest.mark.parametrize("case", ["heads", "latent", "value_zero", "dtype", "rank2", "list",
                                  "meta"])
def test_bad_w_uv_refused_before_any_collective(impl, case):
    """W_UV of the wrong heads, latent width, no value lanes, another dtype, not 3-D, not a
    tensor, on meta: a ValueError/TypeError naming w_uv or the problem, before any
    collective (a process group that fails the test if used)."""
    n, b, h, lat, v = 2, 2, 4, 16, 8
    outs, lses = partials(1, b, h, lat, torch.bfloat16)
    w = _weights_uv(h, lat, v, torch.bfloat16)
    w = {"heads": w[:2], "latent": w[:, :8], "value_zero": w[..., :0],
         "dtype": w.float(), "rank2": w[0], "list": w.tolist(),
         "meta": torch.empty(h, lat, v, dtype=torch.bfloat16, device="meta")}[case]
    words = r"w_uv|W_UV|shape|dtype|bfloat16|float32|dim|tensor|value|meta|device|\bV\b|\bL\b|\bH\b"
    with refused(words, dtype_problem=True):
        impl.lse_reduce(outs[0], lses[0], Group(n, 0, TripwireGroup(n)), w_uv=w)


def test_projection_bound_admits_the_rounded_oracle():
    """The oracle's latent rounded to T and projected in float64 (the most accurate merge-first
    result there is) is within the merge-first bound, and every element has a positive bound
    in the other order (a check of projection_bounds itself, implementation-free)."""
    n, b, h, lat, v = 2, 4, 2, 64, 16
    outs, lses = partials(n, b, h, lat, torch.bfloat16, seed=3)
    w = _weights_uv(h, lat, v, torch.bfloat16)
    from dcp_a2a.reference import lse_weighted_combine

    latent = lse_weighted_combine(outs, lses).to(torch.bfloat16)
    y = torch.einsum("bhl,hlv->bhv", latent.double(), w.double()).to(torch.bfloat16)
    rep = check_up_projection(y, None, outs, lses, w, order="after_merge")
    assert rep.ok, rep.describe()
    orc = projection_bounds(outs, lses, w, order="before_exchange")
    assert torch.all(orc.out_bound > 0)


def test_replay_group_refuses_what_it_does_not_model():
    """The in-process group answers the collectives it models and no other (a collective it
    answered wrongly would judge an implementation on a fiction)."""
    g = ReplayGroup(2, 0, [[], []])
    with pytest.raises(NotImplementedError):
        g.allreduce([torch.zeros(2)])
