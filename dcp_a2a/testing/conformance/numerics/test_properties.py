"""Property-based tests (hypothesis) over shapes, dtypes, LSE distributions and empty ranks.

Example counts are bounded (every example runs the interpreted kernels on the CPU): the
merge property runs MERGE_EXAMPLES examples of one destination rank each; the bound's
soundness against the exactly rounded merge is pure torch and runs more.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from dcp_a2a.testing.compare import check_merge
from dcp_a2a.testing.data import DTYPES
from dcp_a2a.testing.degraded import correctly_rounded

pytestmark = [pytest.mark.numerics, pytest.mark.conformance, pytest.mark.clause("merge bound")]

MERGE_EXAMPLES = 12
ORACLE_EXAMPLES = 60


@st.composite
def cases(draw):
    n = draw(st.integers(1, 6))
    hpr = draw(st.integers(1, 3))
    shape = (n, draw(st.integers(1, 2)), n * hpr, draw(st.integers(1, 40)))
    dtype = draw(st.sampled_from(DTYPES))
    spread = draw(st.sampled_from([0.0, 0.5, 4.0, 30.0, 1e3]))
    scale = draw(st.sampled_from([1e-3, 1.0, 100.0]))
    p_empty = draw(st.sampled_from([0.0, 0.0, 0.3]))
    base_e = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    outs = (torch.randn(shape, generator=g) * scale).to(dtype)
    lses = torch.randn(shape[:3], generator=g) * spread + torch.randn(shape[1:3], generator=g) * 8
    empty = torch.rand(shape[:3], generator=g) < p_empty
    lses = torch.where(empty, torch.full_like(lses, -math.inf), lses).to(torch.float32)
    outs = torch.where(empty[..., None], torch.full_like(outs, math.nan), outs)
    return outs, lses, base_e, draw(st.integers(0, n - 1))


@settings(max_examples=MERGE_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=cases())
def test_merge_within_bound(exchange, merge_check, case):
    outs, lses, base_e, rank = case
    if exchange.impl.envelope.outside(base_e=base_e):
        base_e = not base_e  # the drawn base is outside the envelope: the other one
    (out, lse), heads = exchange.merge_rank(outs, lses, rank, is_lse_base_on_e=base_e)
    merge_check(out, lse, outs, lses, is_lse_base_on_e=base_e, heads=heads)


@settings(max_examples=ORACLE_EXAMPLES, deadline=None, derandomize=True)
@given(case=cases())
def test_bound_accepts_exactly_rounded_merge(case):
    """Soundness of the bound itself: the float64 merge rounded once to T always passes."""
    outs, lses, base_e, _ = case
    rep = check_merge(correctly_rounded(outs, lses, base_e), None, outs, lses,
                      is_lse_base_on_e=base_e)
    assert rep.ok, rep.describe()
