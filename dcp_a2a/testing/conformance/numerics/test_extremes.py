"""Extreme inputs: huge LSE spreads, values near the float32 limits (partials at FLT_MAX
included), weights in fp32's subnormal range, a single finite rank, all ranks empty, subnormal
outputs, float16 outputs near 65504, and N = 32 ranks. Each must merge without NaN and within
the derived bound (an inf only where the overflow rule of tolerances.yaml allows it)."""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.testing.compare import check_merge
from dcp_a2a.testing.data import DTYPES, partials
from dcp_a2a.testing.degraded import clamped_exponent, subnormal_weight_inputs

pytestmark = [pytest.mark.numerics, pytest.mark.conformance, pytest.mark.clause("merge bound")]

ids = str
F32_MAX = torch.finfo(torch.float32).max


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _uniform(shape, lo, hi, g):
    return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)


def _signs(shape, g):
    return torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)


def _merge_and_check(exchange, merge_check, outs, lses, base_e=None):
    base_e = exchange.impl.envelope.base_e if base_e is None else base_e
    out, lse = exchange.merge(outs, lses, is_lse_base_on_e=base_e)
    merge_check(out, lse, outs, lses, is_lse_base_on_e=base_e)
    return out, lse


@pytest.mark.parametrize("spread", [1e2, 1e4])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_huge_lse_spread(exchange, merge_check, dtype, spread):
    g = _gen(1)
    outs, _ = partials(4, 1, 16, 16, dtype, seed=1)
    lses = _uniform((4, 1, 16), -spread, spread, g).to(torch.float32)
    out, lse = _merge_and_check(exchange, merge_check, outs, lses)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy, interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_lse_near_float32_limits(exchange, merge_check, dtype):
    """LSEs of magnitude up to FLT_MAX: s_n - max overflows to -inf for opposite signs, which
    must mean weight 0, not NaN; the returned LSE stays finite."""
    g = _gen(2)
    outs, _ = partials(4, 2, 8, 16, dtype, seed=2)
    mag = _uniform((4, 2, 8), 1e36, F32_MAX, g) * _signs((4, 2, 8), g)
    lses = mag.to(torch.float32)
    lses[:, 0, :2] = F32_MAX  # ties at the largest finite value
    out, lse = _merge_and_check(exchange, merge_check, outs, lses)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=ids)
def test_outputs_near_float32_limits(exchange, merge_check, dtype):
    """|o_n| up to 2^127: the merge is a convex combination, so with normalised weights it
    cannot overflow; a merge that divides by the weights' sum last (in scope, tolerances.yaml)
    can, in its float32 accumulator, and the overflow rule accepts an inf exactly there. No NaN
    and no inf of the wrong sign in any case."""
    g = _gen(3)
    outs = (_uniform((4, 2, 8, 16), 2.0**120, 2.0**127, g) * _signs((4, 2, 8, 16), g)).to(dtype)
    _, lses = partials(4, 2, 8, 16, dtype, seed=3, spread=1.0)
    out, _ = _merge_and_check(exchange, merge_check, outs, lses)
    assert not torch.isnan(out).any()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy, interpreter
def test_partials_at_float32_max(exchange, merge_check):
    """Every partial +-FLT_MAX (float32; the sign alternates by head), N = 2, LSEs on a 1/16
    grid in [-1, 1]: the rounded weights can sum above 1 and the merge round to inf (our
    kernel on the CPU: 8 of these 32 rows). Within the bound, where an inf of y*'s sign counts
    as the least value that overflows (tolerances.yaml, overflow); never NaN, never the wrong
    sign. An inf of the wrong sign fails the same check (infinite ratio)."""
    n, h = 2, 32
    outs = torch.full((n, 1, h, 2), F32_MAX, dtype=torch.float32)
    outs[:, :, 1::2] = -F32_MAX
    lses = (torch.randint(-16, 17, (n, 1, h), generator=_gen(8)) / 16.0).to(torch.float32)
    out, _ = _merge_and_check(exchange, merge_check, outs, lses)
    expect = torch.sign(outs[0])
    assert torch.equal(torch.sign(out), expect), "NaN or a wrong sign at FLT_MAX"
    wrong = -expect * math.inf
    assert check_merge(wrong, None, outs, lses).output.worst_ratio == math.inf


@pytest.mark.parametrize("dtype,big", [(torch.float32, 2.0 ** 120), (torch.bfloat16, 2.0 ** 120),
                                       (torch.float32, 2.0 ** 30)],
                         ids=["fp32-2^120", "bf16-2^120", "fp32-2^30"])
def test_subnormal_weights(exchange, merge_check, dtype, big):
    """A rank 95 / 100 nats below the max (weights ~2^-137 / 2^-144, fp32
    subnormals) with a huge partial. fp32 holds such a weight to a few %, flush-to-zero code
    drops it; the small-weight floor allows either (our kernel on the CPU: ratio 0.017; it was
    1179 / 8.0 / 24 before the floor; a flushed weight sits just below 1). The check keeps its
    power here: shifts clamped to keep the weights normal (weight 2^-126) fail it, ~3e5x."""
    outs, lses = subnormal_weight_inputs(dtype, big)
    out, _ = _merge_and_check(exchange, merge_check, outs, lses)
    assert torch.isfinite(out).all()
    rep = check_merge(clamped_exponent(outs, lses), None, outs, lses)
    assert rep.output.worst_ratio > 1000.0, rep.describe()


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_single_finite_rank_among_empty_ranks(exchange, merge_check, dtype):
    """Per row a different rank holds the only finite LSE; the others are -inf with NaN
    partials. The merge is that rank's partial exactly (weight exactly 1) and its LSE."""
    n, b, h, d = 8, 1, 16, 16
    outs, lses = partials(n, b, h, d, dtype, seed=4)
    owner = torch.randint(0, n, (b, h), generator=_gen(4))
    mine = torch.arange(n)[:, None, None] == owner
    outs = torch.where(mine[..., None], outs, torch.full_like(outs, math.nan))
    lses = torch.where(mine, lses, torch.full_like(lses, -math.inf))
    out, lse = _merge_and_check(exchange, merge_check, outs, lses)
    expect = outs.gather(0, owner[None, ..., None].expand(1, b, h, d))[0]
    assert torch.equal(out, expect)
    assert torch.equal(lse, lses.gather(0, owner[None])[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_all_ranks_empty(exchange, merge_check, dtype):
    """Every rank -inf (NaN partials): the merge is 0 with LSE -inf, never NaN."""
    outs = torch.full((4, 1, 8, 16), math.nan, dtype=dtype)
    lses = torch.full((4, 1, 8), -math.inf)
    out, lse = _merge_and_check(exchange, merge_check, outs, lses)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, -math.inf))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_subnormal_outputs(exchange, merge_check, dtype):
    tiny = torch.finfo(dtype).tiny  # smallest normal
    g = _gen(5)
    outs = (torch.randn(4, 2, 8, 16, generator=g, dtype=torch.float64) * tiny / 8).to(dtype)
    assert (outs != 0).any() and (outs.abs() < tiny).all()
    _, lses = partials(4, 2, 8, 16, dtype, seed=5)
    out, _ = _merge_and_check(exchange, merge_check, outs, lses)
    if dtype == torch.float16:
        # fp16 subnormals are normal fp32 values: no device may flush them (bf16/fp32
        # subnormals may be flushed on a GPU; the bound's ftz term allows exactly that)
        assert (out != 0).any(), "float16 subnormal outputs flushed to zero"


def test_float16_near_max(exchange, merge_check):
    """Partials in [60000, 65504]: the merged value must not overflow to inf."""
    g = _gen(6)
    outs = _uniform((4, 2, 8, 16), 6.0e4, 65504.0, g).to(torch.float16)
    outs[:, 0, 0] = 65504.0
    _, lses = partials(4, 2, 8, 16, torch.float16, seed=6)
    out, _ = _merge_and_check(exchange, merge_check, outs, lses)
    assert torch.isfinite(out).all()
    assert (out[0, 0] == 65504.0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_thirty_two_ranks(exchange, merge_check, dtype):
    """N = 32 (one head per rank): merged for the first and last destination rank."""
    outs, lses = partials(32, 1, 32, 24, dtype, seed=7, spread=6.0)
    for rank in (0, 31):
        (out, lse), heads = exchange.merge_rank(outs, lses, rank)
        merge_check(out, lse, outs, lses, heads=heads)
