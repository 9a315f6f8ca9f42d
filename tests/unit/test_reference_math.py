"""Unit tier: the float64 reference on cases computed by hand, and the scipy oracle."""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.reference import (combine_magnitude, logsumexp_oracle, lse_weighted_combine,
                               mean_shift, small_weight_magnitude)

pytestmark = pytest.mark.unit


def test_equal_lses_average():
    outs = torch.tensor([1.0, 3.0, 8.0], dtype=torch.float64).view(3, 1, 1, 1)
    lses = torch.full((3, 1, 1), 2.5, dtype=torch.float64)
    out, g = lse_weighted_combine(outs, lses, return_lse=True)
    assert out.item() == pytest.approx(4.0, rel=1e-15)
    assert g.item() == pytest.approx(2.5 + math.log(3.0), rel=1e-15)


def test_dominant_rank_wins():
    outs = torch.tensor([5.0, -7.0], dtype=torch.float64).view(2, 1, 1, 1)
    lses = torch.tensor([0.0, 800.0], dtype=torch.float64).view(2, 1, 1)
    out, g = lse_weighted_combine(outs, lses, return_lse=True)
    assert out.item() == -7.0 and g.item() == 800.0


def test_base2_hand_value():
    # weights 2^1 : 2^3 = 1 : 4 -> (1*2 + 4*7) / 5 = 6; g = log2(2 + 8)
    outs = torch.tensor([2.0, 7.0], dtype=torch.float64).view(2, 1, 1, 1)
    lses = torch.tensor([1.0, 3.0], dtype=torch.float64).view(2, 1, 1)
    out, g = lse_weighted_combine(outs, lses, return_lse=True, is_lse_base_on_e=False)
    assert out.item() == pytest.approx(6.0, rel=1e-15)
    assert g.item() == pytest.approx(math.log2(10.0), rel=1e-15)


def test_base_e_hand_value():
    outs = torch.tensor([1.0, 0.0], dtype=torch.float64).view(2, 1, 1, 1)
    lses = torch.tensor([math.log(3.0), 0.0], dtype=torch.float64).view(2, 1, 1)
    out, g = lse_weighted_combine(outs, lses, return_lse=True)
    assert out.item() == pytest.approx(0.75, rel=1e-15)
    assert g.item() == pytest.approx(math.log(4.0), rel=1e-15)


@pytest.mark.parametrize("base_e", [True, False])
def test_returned_lse_is_the_logsumexp(base_e):
    g_ = torch.Generator().manual_seed(1)
    lses = torch.randn(5, 3, 4, generator=g_, dtype=torch.float64) * 20
    outs = torch.randn(5, 3, 4, 2, generator=g_, dtype=torch.float64)
    _, g = lse_weighted_combine(outs, lses, return_lse=True, is_lse_base_on_e=base_e)
    torch.testing.assert_close(g, logsumexp_oracle(lses, base_e), rtol=0, atol=1e-12)


def test_identity_and_nan_guard():
    # -inf, NaN and +inf LSEs all weigh 0; their NaN partials must not leak in
    outs = torch.tensor([4.0, math.nan, math.nan, math.inf], dtype=torch.float64).view(4, 1, 1, 1)
    lses = torch.tensor([1.0, -math.inf, math.nan, math.inf], dtype=torch.float64).view(4, 1, 1)
    out, g = lse_weighted_combine(outs, lses, return_lse=True)
    assert out.item() == 4.0 and g.item() == 1.0


def test_all_minus_inf_row():
    outs = torch.full((3, 1, 1, 2), math.nan, dtype=torch.float64)
    lses = torch.full((3, 1, 1), -math.inf, dtype=torch.float64)
    out, g = lse_weighted_combine(outs, lses, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and g.item() == -math.inf
    assert logsumexp_oracle(lses).item() == -math.inf


def test_magnitude_terms():
    outs = torch.tensor([2.0, -4.0], dtype=torch.float64).view(2, 1, 1, 1)
    lses = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64).view(2, 1, 1)
    mag, shift = combine_magnitude(outs, lses)
    assert mag.item() == pytest.approx(0.25 * 2 + 0.75 * 4, rel=1e-15)
    assert shift.item() == pytest.approx(0.25 * 2 * math.log(3.0), rel=1e-15)


def test_mean_shift_hand_value():
    # weights 1/4, 3/4; shifts -ln 3, 0: X = ln(3) / 4. Base 2: weights 1/5, 4/5 at -2, 0: 2/5
    lses = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64).view(2, 1, 1)
    assert mean_shift(lses).item() == pytest.approx(0.25 * math.log(3.0), rel=1e-15)
    lses = torch.tensor([1.0, 3.0, -math.inf], dtype=torch.float64).view(3, 1, 1)
    assert mean_shift(lses, False).item() == pytest.approx(0.4, rel=1e-15)
    assert mean_shift(torch.full((2, 1, 1), -math.inf)).item() == 0.0  # empty row


def test_small_weight_magnitude_hand_values():
    below, at_least = 2.0 ** -126, 2.0 ** -149
    outs = torch.tensor([3.0, -2.0, 5.0, math.nan], dtype=torch.float64).view(4, 1, 1, 1)
    # rank 1: weight e^-95 ~ 2^-137 (counted as itself); rank 2: e^-1000, 0 in float64 but a
    # finite LSE (counted as 2^-149); rank 3: -inf, weight exactly 0 (its NaN not counted)
    lses = torch.tensor([0.0, -95.0, -1000.0, -math.inf], dtype=torch.float64).view(4, 1, 1)
    got = small_weight_magnitude(outs, lses, True, below, at_least).item()
    w1 = math.exp(-95.0) / (1.0 + math.exp(-95.0))
    assert got == pytest.approx(2.0 * w1 + 5.0 * at_least, rel=1e-12)
    # nothing below the smallest normal: 0
    lses = torch.tensor([0.0, -80.0, -1.0, -math.inf], dtype=torch.float64).view(4, 1, 1)
    assert small_weight_magnitude(outs, lses, True, below, at_least).item() == 0.0


def test_reference_rejects_bad_input():
    outs, lses = torch.zeros(2, 1, 2, 4), torch.zeros(2, 1, 2)
    with pytest.raises(ValueError, match="at_least"):
        small_weight_magnitude(outs, lses, True, 2.0 ** -149, 2.0 ** -126)
    with pytest.raises(TypeError, match="floating point"):
        combine_magnitude(outs.to(torch.int32), lses)
    with pytest.raises(ValueError, match=r"lses\[N, B, H\]"):
        mean_shift(lses[0])
    with pytest.raises(TypeError, match="torch.Tensor"):
        lse_weighted_combine(outs.tolist(), lses)
