"""Bounds for relations between two merged results, composed from dcp_a2a.tolerances.

A metamorphic relation compares two outputs of the implementation, each within its own derived
bound of its own float64 oracle; where the two oracles differ (rounded inputs, rounded
intermediate results) the difference is propagated to first order in u. Nothing here is a new
tolerance: every number comes from tolerances.yaml, and every single-merge bound from
:func:`dcp_a2a.testing.compare.oracle_bounds`, the function check_merge uses.
"""

from __future__ import annotations

import math

import torch

from dcp_a2a.testing import tolerances as tol
from dcp_a2a.testing.compare import OracleBounds, oracle_bounds
from dcp_a2a.reference import sanitize_lse


def u() -> float:
    return tol.load()["fp32_unit_roundoff"]


def rounding_ulps(dtype) -> float:
    return tol.load()["a2a"][tol.dtype_name(dtype)]["output"]["rounding_ulps"]


def weights(lses, base_e=True):
    """Exact normalised weights [N, B, H] (float64; 0 for -inf ranks, rows of all -inf too)."""
    s = sanitize_lse(lses)
    m = s.amax(0)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m) if base_e else torch.exp2(s - m)
    tot = e.sum(0)
    return torch.where(tot > 0, e / torch.where(tot > 0, tot, torch.ones_like(tot)), 0.0)


def Oracle(outs, lses, base_e=True, kind="a2a",  # noqa: N802 (was a class)
           formulation="global_max") -> OracleBounds:
    """The float64 merge of ``outs[N, B, H, D]`` / ``lses[N, B, H]`` and its derived bounds
    (``.out``, ``.lse``, ``.mag``, ``.out_bound``, ``.lse_bound``, ...), for a result in
    ``outs.dtype``: :func:`dcp_a2a.testing.compare.oracle_bounds`."""
    return oracle_bounds(outs, lses, outs.dtype, kind=kind, is_lse_base_on_e=base_e,
                         formulation=formulation)


def judge(relation: str, bound_for) -> None:
    """Check a relation whose bound ``bound_for(formulation)`` composes (pairs of
    ``(excess, bound)``): within the global-max bounds it holds; outside them but within a
    weaker formulation's (tolerances.yaml ``online``, ``rounded_lse``) it is weaker precision
    (:class:`~dcp_a2a.testing.verdicts.Precision`); else it fails (a defect)."""
    from dcp_a2a.testing.compare import WEAKER_FORMULATIONS
    from dcp_a2a.testing.verdicts import Precision

    ratio = max(worst(e, b) for e, b in bound_for("global_max"))
    if ratio <= 1.0:
        return
    for form, says in WEAKER_FORMULATIONS.items():
        if max(worst(e, b) for e, b in bound_for(form)) <= 1.0:
            raise Precision(f"{relation}: {ratio:.3g}x its composed bound; within the bound "
                            f"composed for a {says}")
    raise AssertionError(f"{relation}: {ratio:.3g}x its composed bound")


def abs_diff(a, b):
    """|a - b| in float64, 0 where both are equal (incl. equal infinities), inf for NaN."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    d = torch.where(a == b, torch.zeros_like(a), (a - b).abs())
    return torch.nan_to_num(d, nan=math.inf)


def lse_rounding_shift(lses) -> torch.Tensor:
    """max_n |fl32(s_n) - s_n| <= u max_n |s_n| per row [B, H]: how far rounding the LSEs to
    float32 can move the merged LSE (and, doubled, the log of any weight)."""
    s = sanitize_lse(lses)
    s = torch.where(torch.isinf(s), torch.zeros_like(s), s)
    return u() * s.abs().amax(0)


def worst(excess: torch.Tensor, bound: torch.Tensor) -> float:
    r = torch.where(excess == 0, torch.zeros_like(excess), excess / bound)
    return float(r.max()) if r.numel() else 0.0
