"""Unit tier: the derived bound itself (tolerances.yaml, assembled by
``dcp_a2a.testing.compare.oracle_bounds``) at its edges, judged with fp32 emulations of merge
arithmetic (``dcp_a2a.testing.degraded.FP32`` / ``fp32_merge``), not with an implementation:

* subnormal weights, with and without flush-to-zero: a correct merge exceeded the bound before
  the small-weight floor F and passes with it, and F still rejects a wrong weight;
* the overflow rule: at FLT_MAX a correctly evaluated merge may round to inf, and is accepted,
  as is the overflow of a merge that divides by the weights' sum last where its accumulator
  reaches the threshold; an inf where no formulation in scope overflows, or of the wrong sign,
  is not;
* the scope: a running-max (online) merge with exp errors inside the bound's own error model
  exceeds the global-max LSE bound and stays within its composed bound (``online``);
* X = sum_n w_n |x_n| <= min((N-1)/e, ln N), which the normalisation term relies on.

Each test asserts on both sides (the case fails without the fix, or the mutant fails with it)
and names its ratio. Pure torch, tiny shapes: well under a second in all.
"""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.reference import mean_shift, weight_total
from dcp_a2a.testing import tolerances as tol
from dcp_a2a.testing.compare import check_merge, oracle_bounds
from dcp_a2a.testing.degraded import (EX2_APPROX_REL, FP32, clamped_exponent, fp32_merge,
                                      subnormal_weight_inputs)

pytestmark = pytest.mark.unit

F32_MAX = torch.finfo(torch.float32).max


def _ratios(out, outs, lses, base_e=True):
    """(worst err/bound with the small-weight floor, without it): the second is the bound
    before the small-weight floor (E less F; everything else the same)."""
    orc = oracle_bounds(outs, lses, out.dtype, is_lse_base_on_e=base_e)
    err = (out.double() - orc.out).abs()
    bare = tol.output_bound_from(orc.out, orc.evaluation - orc.small, orc.mag, out.dtype, orc.n)
    return float((err / orc.out_bound).max()), float((err / bare).max())


# the reported false positive (degraded.subnormal_weight_inputs) at the sizes it was seen at
REPORTED_CASES = [(torch.float32, 2.0 ** 120), (torch.bfloat16, 2.0 ** 120),
               (torch.float32, 2.0 ** 30)]


@pytest.mark.parametrize("dtype,big", REPORTED_CASES, ids=["fp32-2^120", "bf16-2^120", "fp32-2^30"])
def test_subnormal_weight_rounded(dtype, big):
    """Subnormal weights computed with gradual underflow (fp32 holds e^-100 to 1/27): the
    error is a few % of w_1|o_1|. Measured: 0.017 with F; without it 1189 (fp32, 2^120), 8.0
    (bf16), 24 (fp32, 2^30) -- the false positive the floor fixed (1179 against the bound before
    it, 3N + 11 instead of 2N + 11 + 2.25X); our kernel gives the same numbers."""
    outs, lses = subnormal_weight_inputs(dtype, big)
    out, _ = fp32_merge(outs, lses)
    with_floor, without = _ratios(out, outs, lses)
    assert with_floor <= 0.05, with_floor
    assert without > 5.0, without


@pytest.mark.parametrize("dtype,big", REPORTED_CASES, ids=["fp32-2^120", "bf16-2^120", "fp32-2^30"])
def test_subnormal_weight_flushed_to_zero(dtype, big):
    """Flush-to-zero arithmetic (compiled GPU code may use it) drops rank 1 entirely: the error
    is all of w_1|o_1|, exactly what F allows (ratio 0.99999, 0.996, 0.99998). Without F:
    7.3e4 (fp32, 2^120), 489 (bf16), 5.5e4 (fp32, 2^30); at LSE -95 it fails from |o_1| ~ 2^13
    up."""
    outs, lses = subnormal_weight_inputs(dtype, big)
    out, _ = fp32_merge(outs, lses, arith=FP32(ftz=True))
    assert torch.equal(out, torch.zeros_like(out)), "the emulation did not flush"
    with_floor, without = _ratios(out, outs, lses)
    assert with_floor <= 1.0, with_floor
    assert without > 100.0, without


@pytest.mark.parametrize("dtype,big", REPORTED_CASES, ids=["fp32-2^120", "bf16-2^120", "fp32-2^30"])
def test_floor_still_rejects_a_wrong_small_weight(dtype, big):
    """F allows 100 % of a subnormal weight, no more: clamping the shifts at fp32's normal range
    (weight 2^-126 instead of e^-95 or e^-100) is rejected: 3.2e5 (the e^-100 head)."""
    outs, lses = subnormal_weight_inputs(dtype, big)
    rep = check_merge(clamped_exponent(outs, lses), None, outs, lses)
    assert rep.output.worst_ratio > 1000.0, rep.describe()


def test_floor_is_zero_for_normal_weights():
    """F is 0 unless some rank's normalised weight is below 2^-126 (~87.3 nats under the row
    max, less ln of the weights' sum <= ln N): realistic checks do not move."""
    g = torch.Generator().manual_seed(0)
    outs = torch.randn(4, 2, 8, 16, generator=g)
    lses = (torch.randn(4, 2, 8, generator=g) * 10.0).clamp(-40.0, 40.0) + 5.0
    lses[0] = lses.amax(0)  # rank 0 holds the max; the others are within 80 nats of it
    lses[1] = lses[0] - 85.0  # weight >= e^-85 / 4 > 2^-126: normal
    orc = oracle_bounds(outs, lses)
    assert torch.equal(orc.small, torch.zeros_like(orc.small))
    lses[1] = lses[0] - 88.0  # weight <= e^-88 < 2^-126 on every row
    assert (oracle_bounds(outs, lses).small > 0).all()


def test_overflow_at_flt_max_is_accepted():
    """Every partial FLT_MAX, N = 2, equal LSEs, the division 2 ulp high (div.full.f32's
    allowance): the weights sum to 1 + 4u and the merge rounds to inf. The overflow rule
    accepts it (inf stands for 2^128 - 2^103, 2^103 above y* = FLT_MAX, against 2 * bound);
    before, any inf was an infinite ratio."""
    outs = torch.full((2, 1, 2, 4), F32_MAX, dtype=torch.float32)
    outs[:, :, 1] = -F32_MAX
    lses = torch.zeros(2, 1, 2)
    out, _ = fp32_merge(outs, lses, arith=FP32(div_error=EX2_APPROX_REL))
    assert torch.isinf(out).all() and torch.equal(torch.sign(out[0, 1]), -torch.ones(4))
    rep = check_merge(out, None, outs, lses)
    assert rep.ok and rep.worst_ratio < 0.05, rep.describe()  # measured 0.016
    # without the rule the error of an inf is infinite, whatever the bound
    assert torch.isinf(out.double() - oracle_bounds(outs, lses).out).all()


def test_overflow_rule_rejects_other_infinities():
    """An inf where y* = 2^127 (half FLT_MAX) and no formulation in scope overflows (rank 1
    weighs e^-10, so even unnormalised partial sums stay near 2^127) is rejected, about 1e5
    times its bound; an inf of the wrong sign is an infinite ratio."""
    half = torch.full((2, 1, 2, 4), 2.0 ** 127, dtype=torch.float32)
    lses = torch.zeros(2, 1, 2)
    lses[1] = -10.0
    inf = torch.full((1, 2, 4), math.inf)
    rep = check_merge(inf, None, half, lses)
    assert not rep.ok and 1e5 < rep.output.worst_ratio < math.inf, rep.describe()
    top = torch.full((2, 1, 2, 4), F32_MAX, dtype=torch.float32)
    rep = check_merge(-inf, None, top, lses)
    assert rep.output.worst_ratio == math.inf, rep.describe()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_overflow_of_a_divide_last_merge_is_accepted(dtype):
    """The scope's second form, acc = sum_n e^{x_n} o_n then y = acc / s, correctly rounded:
    partials of 2^126 to 2^127 (N = 4, LSEs within 0.5 of each other) overflow its float32
    accumulator where s * M passes the threshold although |y*| is half of it. Accepted now;
    the rule for normalised weights alone rejected those infs by orders of magnitude, failing a
    correct implementation. The normalised merge of the same partials stays finite; an inf
    in row 1 (partials near 2^100: s * M far below the threshold) is still rejected."""
    g = torch.Generator().manual_seed(3)
    mag = 1.0 + torch.rand(4, 2, 8, 16, generator=g, dtype=torch.float64)
    mag[:, 0] *= 2.0 ** 126
    mag[:, 1] *= 2.0 ** 100
    outs = mag.to(dtype)
    lses = torch.rand(4, 2, 8, generator=g) * 0.5 + 5.0
    out, _ = fp32_merge(outs, lses, formulation="divide_last")
    over = torch.isinf(out)
    assert over.any()
    orc = oracle_bounds(outs, lses, dtype)
    far = over & (orc.out.abs() < tol.overflow_threshold(dtype) / 2)
    assert far.any()  # infs the normalised-weights rule cannot explain
    rep = check_merge(out, None, outs, lses)
    assert rep.ok, rep.describe()
    assert torch.isfinite(fp32_merge(outs, lses)[0]).all()
    reach = orc.weight_total[..., None] * orc.mag
    below = ~over & (reach < tol.overflow_threshold(torch.float32) / 2)
    assert below.any()
    forged = torch.where(below, torch.sign(orc.out) * math.inf, out.double()).to(dtype)
    assert not check_merge(forged, None, outs, lses).ok


@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_online_merge_is_outside_the_global_max_bound(base_e):
    """Scope. Every exp within the bound's error model (4u, here all pushed up, exp(0)
    included), division 4u: the global-max merge stays within its bound (LSE ratio 0.25 base
    e, 0.26 base 2); the online merge, whose rank 0 passes through N = 8 exponentials, exceeds
    the global-max LSE bound (1.99, 2.13) and stays within the composed online bound (0.63,
    0.63). Its output stays within the global-max bound (0.34): the exp errors, shared by
    acc and l, largely cancel in y = acc / l, but add up in g = m + log l."""
    n, h, d = 8, 8, 4
    g = torch.Generator().manual_seed(n)
    outs = torch.randn(n, 1, h, d, generator=g)
    lses = torch.cat([torch.zeros(1, 1, h), torch.full((n - 1, 1, h), -30.0)])  # rank 0 max
    ar = FP32(exp_error=EX2_APPROX_REL, exp_sign=1.0, div_error=EX2_APPROX_REL)

    def lse_ratio(lse, formulation):
        orc = oracle_bounds(outs, lses, is_lse_base_on_e=base_e, formulation=formulation)
        return float(((lse.double() - orc.lse).abs() / orc.lse_bound).max())

    _, lse = fp32_merge(outs, lses, base_e, formulation="global_max", arith=ar)
    assert lse_ratio(lse, "global_max") < 0.5
    out, lse = fp32_merge(outs, lses, base_e, formulation="online", arith=ar)
    assert lse_ratio(lse, "global_max") > 1.5
    assert lse_ratio(lse, "online") <= 0.7
    rep = check_merge(out, None, outs, lses, is_lse_base_on_e=base_e)
    assert rep.ok, rep.describe()


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 32])
def test_mean_shift_is_bounded_by_ln_n_and_n_minus_1_over_e(n):
    """The old normalisation term used (N-1)/e; the exact X is below both it and ln N (the
    entropy bound), attained in the limit, so X is the tighter, exact choice."""
    g = torch.Generator().manual_seed(n)
    lses = torch.randn(n, 64, 8, generator=g, dtype=torch.float64) * torch.tensor(
        [0.1, 1.0, 3.0, 30.0], dtype=torch.float64).repeat_interleave(16).view(1, 64, 1)
    x = mean_shift(lses)
    cap = min((n - 1) / math.e, math.log(n))
    assert float(x.max()) <= cap + 1e-12
    assert float(mean_shift(lses / math.log(2.0), False).max()) <= cap / math.log(2.0) + 1e-12
    if n == 2:  # w|x| at its maximum 1/e for one rank; the two-rank optimum is close to it
        s = torch.tensor([0.0, -1.2785], dtype=torch.float64).view(2, 1, 1)
        assert float(mean_shift(s)) > 0.27


def test_weight_total_is_the_unnormalised_sum():
    """s = sum_n e^{x_n}: N for equal LSEs, 1 when one rank dominates, 1 + 2^-k for a rank k
    bits below the max in base 2, 0 for a row of -inf (NaN and +inf count as -inf)."""
    lses = torch.tensor([[0.0, 5.0, -3.0, -math.inf],
                         [0.0, -95.0, -4.0, math.nan],
                         [0.0, -99.0, -math.inf, math.inf]]).view(3, 1, 4)
    s = weight_total(lses, False)[0]
    assert s.dtype == torch.float64
    assert s.tolist() == [3.0, 1.0, 1.5, 0.0]  # 1 + 2^-100 + 2^-104 is 1 in float64
    assert float(weight_total(lses[:, :, :1])) == 3.0
    with pytest.raises(ValueError, match=r"lses\[N, B, H\]"):
        weight_total(lses[0])
    with pytest.raises(TypeError, match="floating-point"):
        weight_total(lses.to(torch.int32))


def test_bad_input_is_a_clear_error():
    outs, lses = torch.zeros(2, 1, 2, 4), torch.zeros(2, 1, 2)
    with pytest.raises(ValueError, match="bound kind"):
        oracle_bounds(outs, lses, kind="ring")
    with pytest.raises(ValueError, match="formulation"):
        oracle_bounds(outs, lses, formulation="flash")
    with pytest.raises(ValueError, match="no tolerance for dtype"):
        oracle_bounds(outs, lses, torch.float64)
    with pytest.raises(TypeError, match="is_lse_base_on_e"):
        oracle_bounds(outs, lses, is_lse_base_on_e="e")
    with pytest.raises(ValueError, match=r"outputs\[N, B, H, D\]"):
        oracle_bounds(outs[0], lses)
    with pytest.raises(ValueError, match="formulation"):
        fp32_merge(outs, lses, formulation="flash")
    with pytest.raises(ValueError, match="exp_error"):
        FP32(exp_error=-1e-7)
