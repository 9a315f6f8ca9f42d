"""One comparison helper: an implementation's merge against the float64 oracle.

Errors are reported per element in ulps of the output dtype and as a ratio to the derived bound
(tolerances.yaml). ``ratio <= 1`` passes; the headroom is ``1 / ratio``. A NaN where the oracle is
finite, or a mismatched infinity, counts as an infinite ratio.

Everything is computed on the device the oracle's inputs (``outputs``, ``lses``) live on, in
float64 -- on a GPU the whole check of a 10^8-element merge takes milliseconds -- and only the
summary (scalars, the worst element, a fixed-bin ulp histogram) comes back to the host.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from . import tolerances as tol


@dataclass
class QuantityReport:
    quantity: str            # "output" or "lse"
    elements: int
    max_abs_err: float
    max_ulp_err: float       # in ulps of the output dtype at the oracle value (output only)
    worst_ratio: float       # max over elements of err / bound
    failures: int            # elements with err > bound
    worst_index: tuple = ()
    worst_actual: float = math.nan
    worst_expected: float = math.nan
    upstream_ok: bool = True  # would the upstream atol=rtol check have passed?

    @property
    def ok(self) -> bool:
        return self.failures == 0


# Fixed bins (in ulps of the output dtype) so histograms from many tests can be summed.
ULP_BIN_EDGES = [i / 20 for i in range(21)] + [1.5, 2.0, 4.0, 16.0, math.inf]
# Fixed bins of the per-element error over its bound (the pass criterion: <= 1).
RATIO_BIN_EDGES = [i / 10 for i in range(11)] + [math.inf]


@dataclass
class MergeReport:
    dtype: str
    world_size: int
    base: str
    kind: str
    output: QuantityReport
    lse: QuantityReport | None = None
    ulp_histogram: list = field(default_factory=lambda: [0] * (len(ULP_BIN_EDGES) - 1),
                                repr=False)
    # the output's per-element err / bound: the exact criterion (ulps alone mislead where the
    # bound is not a ulp count, e.g. float32 outputs made tiny by cancellation)
    ratio_histogram: list = field(default_factory=lambda: [0] * (len(RATIO_BIN_EDGES) - 1),
                                  repr=False)

    @property
    def ok(self) -> bool:
        return self.output.ok and (self.lse is None or self.lse.ok)

    @property
    def worst_ratio(self) -> float:
        return max(self.output.worst_ratio, self.lse.worst_ratio if self.lse else 0.0)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["worst_ratio"] = self.worst_ratio
        return d

    def _what_failed(self) -> str:
        """Which quantity is over its bound, for the first line: failures are grouped by it,
        so a merged LSE written wrong (its outputs right) reads as one cause, not as many."""
        if self.ok:
            return ""
        lse_bad = self.lse is not None and not self.lse.ok
        if self.output.ok:
            return ": the LSE over its bound, the output within"
        return ": the output and the LSE over their bounds" if lse_bad else \
            ": the output over its bound"

    def describe(self) -> str:
        lines = [f"merge check ({self.kind}, {self.dtype}, N={self.world_size}, base {self.base})"
                 + self._what_failed()]
        for q in (self.output, self.lse):
            if q is None:
                continue
            status = "ok" if q.ok else f"{q.failures} of {q.elements} elements over the bound"
            lines.append(
                f"  {q.quantity}: {status}; max |err| {q.max_abs_err:.3e}"
                + (f" = {q.max_ulp_err:.3g} ulp" if q.quantity == "output" else "")
                + f"; worst err/bound {q.worst_ratio:.3g} at {q.worst_index}: got "
                f"{q.worst_actual!r}, expected {q.worst_expected!r}"
            )
        return "\n".join(lines)


def ulp_histogram(ulp_errors: torch.Tensor, bin_edges=ULP_BIN_EDGES) -> list[int]:
    """Counts of finite per-element errors (in ulps; or any other unit ``bin_edges`` are in) in
    the bins of ``bin_edges`` ([lo, hi) each), computed where the errors live."""
    v = ulp_errors[torch.isfinite(ulp_errors)].flatten()
    edges = torch.tensor(bin_edges[1:-1], dtype=v.dtype, device=v.device)
    idx = torch.bucketize(v, edges, right=True)
    return torch.bincount(idx, minlength=len(bin_edges) - 1).tolist()


def _errors(actual: torch.Tensor, expected: torch.Tensor):
    a = actual.detach().to(device=expected.device, dtype=torch.float64)
    e = expected.detach().to(torch.float64)
    same = (a == e) | (torch.isnan(a) & torch.isnan(e))
    err = torch.where(same, torch.zeros_like(a), (a - e).abs())
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    return a, e, err


def _quantity(name, a, e, err, bound, ulps, upstream_tol) -> QuantityReport:
    n = err.numel()
    if n == 0:
        return QuantityReport(name, 0, 0.0, 0.0, 0.0, 0)
    ratio = torch.where(err == 0, torch.zeros_like(err), err / bound)
    ratio = torch.nan_to_num(ratio, nan=math.inf, posinf=math.inf)
    flat = int(torch.argmax(ratio))
    # numpy's unravel_index: torch's goes through torch._check, which imports sympy (~1 s a
    # process, paid by every gloo rank)
    idx = tuple(int(i) for i in np.unravel_index(flat, tuple(err.shape)))
    finite = torch.isfinite(e) & torch.isfinite(a)
    up_ok = bool(torch.all(((a - e).abs() <= upstream_tol * (1 + e.abs())) | ~finite)) and bool(
        torch.equal(torch.isfinite(a), torch.isfinite(e)))
    return QuantityReport(
        quantity=name, elements=n, max_abs_err=float(err.max()),
        max_ulp_err=float(ulps.max()) if ulps is not None else math.nan,
        worst_ratio=float(ratio.flatten()[flat]), failures=int((ratio > 1).sum()),
        worst_index=idx, worst_actual=float(a.flatten()[flat]),
        worst_expected=float(e.flatten()[flat]), upstream_ok=up_ok,
    )


@dataclass
class OracleBounds:
    """The float64 oracle of one merge and its derived per-element bounds (all float64):

    out [B, H, D], lse [B, H]        y* and g* (``reference.lse_weighted_combine``)
    mag, shift_mag [B, H, D]         M = sum w|o|, S = sum w|o||x| (``combine_magnitude``)
    mean_shift [B, H]                X = sum w|x| (``reference.mean_shift``)
    weight_total [B, H]              s = sum e^x, the unnormalised weights' sum
                                     (``reference.weight_total``)
    small [B, H, D]                  F, the small-weight floor (``small_weight_magnitude``)
    evaluation [B, H, D]             E, the fp32 evaluation allowance (includes F)
    out_bound [B, H, D], lse_bound [B, H]
    """

    dtype: torch.dtype
    n: int
    base_e: bool
    kind: str
    formulation: str
    out: torch.Tensor
    lse: torch.Tensor
    mag: torch.Tensor
    shift_mag: torch.Tensor
    mean_shift: torch.Tensor
    weight_total: torch.Tensor
    small: torch.Tensor
    evaluation: torch.Tensor
    out_bound: torch.Tensor
    lse_bound: torch.Tensor


def oracle_bounds(outputs: torch.Tensor, lses: torch.Tensor, dtype: torch.dtype | None = None,
                  *, kind: str = "a2a", is_lse_base_on_e: bool = True,
                  formulation: str = "global_max") -> OracleBounds:
    """The one place the derived bound is assembled: oracle and bounds of merging
    ``outputs[N, B, H, D]`` (any float dtype) with ``lses[N, B, H]`` into a result of ``dtype``
    (default ``outputs.dtype``), computed in float64 on the device of ``outputs``.

    ``kind`` "a2a" or "ag_rs" (tolerances.yaml), ``formulation`` "global_max" (every shipped
    kernel and the contract) or "online" (the composed bound of a running-max merge, for the
    scope statement). :func:`check_merge`, the numerics report, the metamorphic relations and the
    e2e bounds all take their bounds from here."""
    from dcp_a2a.reference import (combine_magnitude, lse_weighted_combine, mean_shift,
                                   small_weight_magnitude, weight_total)

    dtype = outputs.dtype if dtype is None else dtype
    tol.dtype_name(dtype)  # ValueError for a dtype without tolerances
    if not isinstance(is_lse_base_on_e, (bool, int, np.bool_)):
        raise TypeError(f"is_lse_base_on_e must be a bool, got {is_lse_base_on_e!r}")
    is_lse_base_on_e = bool(is_lse_base_on_e)
    tol._check_choice("bound kind", kind, tol.KINDS)
    tol._check_choice("formulation", formulation, tol.FORMULATIONS)
    lses = lses.to(outputs.device)
    n = outputs.shape[0]
    ref, ref_lse = lse_weighted_combine(outputs, lses, return_lse=True,
                                        is_lse_base_on_e=is_lse_base_on_e)
    mag, shift_mag = combine_magnitude(outputs, lses, is_lse_base_on_e)
    x = mean_shift(lses, is_lse_base_on_e)
    below, at_least = tol.small_weight_limits()
    small = small_weight_magnitude(outputs, lses, is_lse_base_on_e, below, at_least)
    e = tol.evaluation_bound(mag, shift_mag, x, dtype, n, small, formulation, lse=ref_lse)
    return OracleBounds(
        dtype=dtype, n=n, base_e=is_lse_base_on_e, kind=kind, formulation=formulation,
        out=ref, lse=ref_lse, mag=mag, shift_mag=shift_mag, mean_shift=x,
        weight_total=weight_total(lses, is_lse_base_on_e), small=small,
        evaluation=e, out_bound=tol.output_bound_from(ref, e, mag, dtype, n, kind),
        lse_bound=tol.lse_bound(ref_lse, x, dtype, n, is_lse_base_on_e, formulation))


def overflow_allowance(actual: torch.Tensor, orc: OracleBounds):
    """(mask, err, bound) for the infinite outputs the overflow rule judges (tolerances.yaml
    ``overflow``): an inf of y*'s sign where y* is finite stands for the least magnitude that
    overflows, so its error is how far the merge is from overflowing, against ``reach * bound``:
    within it exactly where the arithmetic of a formulation in scope can overflow. Normalised
    weights: ``threshold_T - |y*|``. Weights e^{x_n} summed before dividing by s: the float32
    accumulator's partial sums reach s * M, so ``(threshold_fp32 - s * M) / s`` (in units of y).
    ``actual`` float64, on orc's device."""
    ref = orc.out
    mask = torch.isinf(actual) & torch.isfinite(ref) & (torch.sign(actual) == torch.sign(ref))
    normalised = (tol.overflow_threshold(orc.dtype) - ref.abs()).clamp(min=0.0)
    s = orc.weight_total[..., None].clamp(min=1.0)  # 0 only in rows of -inf, where y* = 0
    divide_last = ((tol.overflow_threshold(torch.float32) - s * orc.mag) / s).clamp(min=0.0)
    return mask, torch.minimum(normalised, divide_last), tol.overflow_reach() * orc.out_bound


def check_merge(actual_out: torch.Tensor, actual_lse: torch.Tensor | None,
                outputs: torch.Tensor, lses: torch.Tensor, *, is_lse_base_on_e: bool = True,
                kind: str = "a2a", heads: slice | None = None,
                keep_ulp_errors: bool = True, formulation: str = "global_max") -> MergeReport:
    """Compare a merged result with the float64 oracle over ``outputs[N, B, H, D]``,
    ``lses[N, B, H]`` (the partials every rank held). ``heads`` selects the oracle's head range
    when ``actual_out`` is one rank's [B, H/N, D] slice. The check runs on the device of
    ``outputs`` (the actual results are moved there). ``keep_ulp_errors=False`` skips the ulp
    histogram. Bounds from :func:`oracle_bounds`; an infinite output is judged by the overflow
    rule (:func:`overflow_allowance`)."""
    dtype = actual_out.dtype
    n = outputs.shape[0]
    lses = lses.to(outputs.device)
    if heads is not None:
        outputs, lses = outputs[:, :, heads], lses[:, :, heads]
    orc = oracle_bounds(outputs, lses, dtype, kind=kind, is_lse_base_on_e=is_lse_base_on_e,
                        formulation=formulation)
    ref, ref_lse = orc.out, orc.lse
    if tuple(actual_out.shape) != tuple(ref.shape):
        raise AssertionError(f"output shape {tuple(actual_out.shape)} != {tuple(ref.shape)}")
    a, e, err = _errors(actual_out, ref)
    bound = orc.out_bound
    over, over_err, over_bound = overflow_allowance(a, orc)
    err = torch.where(over, over_err, err)
    bound = torch.where(over, over_bound, bound)
    ulps = err / tol.ulp(e, dtype)
    up = tol.upstream(dtype)
    out_q = _quantity("output", a, e, err, bound, ulps, up["output"])
    lse_q = None
    if actual_lse is not None:
        if tuple(actual_lse.shape) != tuple(ref_lse.shape):
            raise AssertionError(f"lse shape {tuple(actual_lse.shape)} != {tuple(ref_lse.shape)}")
        if actual_lse.dtype != torch.float32:
            raise AssertionError(f"returned lse must be float32, got {actual_lse.dtype}")
        la, le, lerr = _errors(actual_lse, ref_lse)
        lse_q = _quantity("lse", la, le, lerr, orc.lse_bound, None, up["lse"])
    rep = MergeReport(tol.dtype_name(dtype), n, "e" if is_lse_base_on_e else "2", kind,
                      out_q, lse_q)
    if keep_ulp_errors:
        rep.ulp_histogram = ulp_histogram(ulps)
        ratio = torch.where(err == 0, torch.zeros_like(err), err / bound)
        # an infinite ratio (a NaN or a wrong infinity) is a failure: counted in the last bin
        rep.ratio_histogram = ulp_histogram(torch.nan_to_num(ratio, nan=1e300, posinf=1e300),
                                            RATIO_BIN_EDGES)
    return rep


# Formulations outside the bound's scope that a failing merge may follow: a failure within one
# of their bounds is weaker precision of a known design, not wrong numbers (.verdicts).
WEAKER_FORMULATIONS = {
    "rounded_lse": "weights from the fp32-rounded merged LSE, exp(s_n - fl(g)), "
                   "tolerances.yaml `rounded_lse`",
    "online": "running-max (online) merge, tolerances.yaml `online`",
}


def weaker_formulation(actual_out, actual_lse, outputs, lses, **kwargs) -> str | None:
    """The first formulation of :data:`WEAKER_FORMULATIONS` within whose bound the result
    lies (``kwargs`` as for :func:`check_merge`), or None: its errors are wrong numbers."""
    for name in WEAKER_FORMULATIONS:
        rep = check_merge(actual_out, actual_lse, outputs, lses, keep_ulp_errors=False,
                          formulation=name, **kwargs)
        if rep.ok:
            return name
    return None


def assert_merge_close(actual_out, actual_lse, outputs, lses, **kwargs) -> MergeReport:
    rep = check_merge(actual_out, actual_lse, outputs, lses, **kwargs)
    if not rep.ok:
        raise AssertionError(rep.describe())
    return rep
