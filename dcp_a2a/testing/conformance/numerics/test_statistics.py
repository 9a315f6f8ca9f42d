"""Rounding bias, tested with scipy.stats.

Over >= 1e5 merged elements (one launch: 8 rows x 128 heads x 128 lanes) the error of each
element in ulps of the output dtype, e_i = (y_i - y*_i) / ulp_T(y*_i), must have mean 0:
round-to-nearest is unbiased, a truncating or directed cast is not. Two statistics, each a
one-sample t-test against 0 (scipy.stats.ttest_1samp; e_i is bounded, so the CLT applies):

    signed   mean of e_i                    catches a cast that rounds one way (e.g. up)
    aligned  mean of sign(y*_i) e_i         catches truncation toward zero, which a signed
                                            mean over symmetric data would average away

ALPHA is the family-wise significance level: each of the two tests runs at ALPHA / 2
(Bonferroni). With a fixed seed the outcome is deterministic; ALPHA = 1e-3 is the rate at which
a correct implementation would fail on a fresh seed. 16-bit outputs only: float32 results have
no final rounding, their error is the evaluation error (reported, not tested for bias).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dcp_a2a.testing import tolerances as tol
from dcp_a2a.reference import lse_weighted_combine
from dcp_a2a.testing.data import partials
from dcp_a2a.testing.degraded import truncate_to

pytestmark = [pytest.mark.numerics, pytest.mark.conformance, pytest.mark.clause("merge bound")]

ALPHA = 1e-3
SHAPE = (2, 8, 256, 128)  # N, B, H, D: rank 0 merges 8 x 128 x 128 = 131072 elements
SIXTEEN = (torch.float16, torch.bfloat16)


def ulp_errors(actual, expected, dtype) -> np.ndarray:
    e = expected.to(torch.float64)
    keep = e != 0
    err = (actual.to(torch.float64) - e) / tol.ulp(e, dtype)
    return err[keep].numpy(), torch.sign(e[keep]).numpy()


def bias_pvalues(err, sign) -> dict:
    return {"signed": float(stats.ttest_1samp(err, 0.0).pvalue),
            "aligned": float(stats.ttest_1samp(err * sign, 0.0).pvalue)}


def round_up_to(y, dtype):
    r = y.to(dtype)
    low = r.to(torch.float64) < y.to(torch.float64)
    return torch.where(low, torch.nextafter(r, torch.full_like(r, float("inf"))), r)


def _inputs(dtype, base_e=True):
    # rank spread 1 nat: no rank dominates, so merged values are generic w.r.t. the T grid.
    # With one dominant rank y* sits within a few ulps of that rank's (T-valued) partial and
    # the rounding error becomes a function of the data (shrinkage toward the other ranks
    # shows up as a ~0.005 ulp "aligned bias" even for the exactly rounded oracle).
    outs, lses = partials(*SHAPE, dtype, seed=2024, spread=1.0)
    hpr = SHAPE[2] // SHAPE[0]
    ref = lse_weighted_combine(outs[:, :, :hpr], lses[:, :, :hpr], is_lse_base_on_e=base_e)
    return outs, lses, ref


@pytest.mark.parametrize("dtype", SIXTEEN, ids=str)
def test_rounding_is_unbiased(exchange, record_property, dtype):
    base_e = exchange.impl.envelope.base_e
    outs, lses, ref = _inputs(dtype, base_e)
    (out, _), heads = exchange.merge_rank(outs, lses, 0, return_lse=False,
                                          is_lse_base_on_e=base_e)
    assert heads.start == 0 and out.numel() >= 100_000
    err, sign = ulp_errors(out, ref, dtype)
    p = bias_pvalues(err, sign)
    record_property("bias", {"dtype": str(dtype), "n": int(err.size),
                             "mean_ulp": float(err.mean()),
                             "mean_aligned_ulp": float((err * sign).mean()), **p})
    assert min(p.values()) > ALPHA / 2, (
        f"rounding bias: mean error {err.mean():.4g} ulp, aligned {(err * sign).mean():.4g} "
        f"ulp, p-values {p}")


@pytest.mark.parametrize("dtype", SIXTEEN, ids=str)
def test_directed_casts_fail_the_bias_test(dtype):
    """The test has power: truncation fails the aligned statistic, rounding up the signed
    one, on the same inputs; the oracle rounded to nearest passes both."""
    outs, lses, ref = _inputs(dtype)
    y32 = ref.to(torch.float32)
    p = bias_pvalues(*ulp_errors(ref.to(dtype), ref, dtype))
    assert min(p.values()) > ALPHA / 2, p
    p = bias_pvalues(*ulp_errors(truncate_to(y32, dtype), ref, dtype))
    assert p["aligned"] < ALPHA / 2, p
    p = bias_pvalues(*ulp_errors(round_up_to(y32, dtype), ref, dtype))
    assert p["signed"] < ALPHA / 2, p
