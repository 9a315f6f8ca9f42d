"""Full-attention ground truth: shard a real attention computation over N ranks, merge the
partials through the implementation under test, and compare with unsharded attention.

q[B, H, D], K, V[B, T, H, D] random (float64). The T tokens are split over N ranks contiguously
(rank r holds a block of tokens) or interleaved (token t on rank t % N, as DCP lays out the KV
cache); with T < N some rank holds no token (its partial is 0/0 = NaN with LSE -inf, the
empty-shard case). Each rank's partial output and LSE are computed in float64 (natural or base-2
LSE), then handed to the exchange as the engine would: output rounded to T, LSE to float32.

Two comparisons per case:
* against the float64 merge of the rounded partials (the oracle the bound is derived for);
* against exact unsharded attention, within the bound plus what rounding the inputs can move:
  sum_n w_n * rounding_ulps * ulp_T(o_n) for the partials and 2u max_n|s_n| * sum_n w_n|o_n|
  for the float32 LSEs (each weight's log moves by at most |δs_n| + |δg| <= 2u max|s|).
"""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.testing import tolerances as tol
from dcp_a2a.testing.conformance.numerics import _bounds

pytestmark = [pytest.mark.numerics, pytest.mark.conformance, pytest.mark.clause("merge bound")]

N, B, H, D = 4, 1, 8, 24  # D = 24: not a power of two; one row (rows cost, lanes do not)


def _attention(q, k, v):
    """(out[B, H, D], lse[B, H]) in float64; an empty token set gives (NaN, -inf)."""
    scores = torch.einsum("bhd,bthd->bht", q, k) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - lse[..., None])
    out = torch.einsum("bht,bthd->bhd", p, v)
    if k.shape[1] == 0:  # what a kernel's 0/0 normalisation leaves behind
        out = torch.full_like(out, math.nan)
    return out, lse


def _shards(t, layout):
    idx = torch.arange(t)
    if layout == "contiguous":
        return list(torch.tensor_split(idx, N))
    return [idx[idx % N == r] for r in range(N)]


@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("layout,tokens", [("contiguous", 37), ("interleaved", 29),
                                           ("interleaved", 3)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_sharded_attention_matches_unsharded(exchange, merge_check, record_property, dtype, layout,
                                             tokens, base_e):
    g = torch.Generator().manual_seed(tokens * 7 + len(layout))
    q = torch.randn(B, H, D, generator=g, dtype=torch.float64) * 2.0
    k = torch.randn(B, tokens, H, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, tokens, H, D, generator=g, dtype=torch.float64)
    exact, exact_lse = _attention(q, k, v)
    parts = [_attention(q, k[:, ix], v[:, ix]) for ix in _shards(tokens, layout)]
    scale = 1.0 if base_e else 1.0 / math.log(2.0)
    outs = torch.stack([o for o, _ in parts]).to(dtype)
    lses = torch.stack([s * scale for _, s in parts]).to(torch.float32)
    if tokens < N:
        assert torch.isnan(outs).any() and torch.isinf(lses).any()  # a truly empty shard

    out, lse = exchange.merge(outs, lses, is_lse_base_on_e=base_e)
    merge_check(out, lse, outs, lses, is_lse_base_on_e=base_e)

    # against exact attention
    orc = _bounds.Oracle(outs, lses, base_e)
    w = _bounds.weights(lses, base_e)
    o_exact = torch.stack([o for o, _ in parts])
    o_exact = torch.where(w[..., None] > 0, o_exact, torch.zeros_like(o_exact))
    input_rounding = (w[..., None] * _bounds.rounding_ulps(dtype) * tol.ulp(o_exact, dtype)).sum(0)
    lse_shift = _bounds.lse_rounding_shift(lses)
    bound = orc.out_bound + input_rounding + 2 * lse_shift[..., None] * orc.mag
    err = _bounds.abs_diff(out, exact)
    ratio = _bounds.worst(err, bound)
    lse_err = _bounds.abs_diff(lse.double(), exact_lse * scale)
    lse_ratio = _bounds.worst(lse_err, orc.lse_bound + lse_shift)
    record_property("exact_attention", {
        "dtype": str(dtype), "max_abs_err": float(err.max()),
        "max_ulp_err": float((err / tol.ulp(exact, dtype)).max()), "err_over_bound": ratio,
        "lse_max_abs_err": float(lse_err.max()), "lse_err_over_bound": lse_ratio})
    assert ratio <= 1.0, f"distance to exact attention {ratio:.3g} x its bound"
    assert lse_ratio <= 1.0, f"LSE distance to exact attention {lse_ratio:.3g} x its bound"
