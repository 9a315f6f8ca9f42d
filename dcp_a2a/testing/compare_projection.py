"""The up-projected merge (``lse_reduce(..., w_uv=W)``) against its float64 oracle: merge the
latent partials in float64, then project by W in float64; per element, the error in ulps of
the output dtype and as a ratio to the bound of the order the implementation took
(tolerances.yaml ``up_projection``, derived there and in docs/numerics.md).

    projection_bounds(outputs[N, B, H, L], lses[N, B, H], w_uv[H, L, V], dtype, order=...)
        -> ProjectionBounds (oracle y*[B, H, V] and its bound; the merged LSE and its bound)
    check_up_projection(actual_out, actual_lse, outputs, lses, w_uv, order=..., heads=...)
        -> compare.MergeReport (kind "up_projection/<order>")

``order`` is ``"before_exchange"`` (each rank projects its partial and rounds it to T, then the
merge) or ``"after_merge"`` (the merge rounds the latent to T, then the projection). The same
magnitudes (M, S, X, F, E) as the merge's bound, from :func:`dcp_a2a.testing.compare.oracle_bounds`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import tolerances as tol
from .compare import MergeReport, _errors, _quantity, oracle_bounds, ulp_histogram, RATIO_BIN_EDGES

ORDERS = ("before_exchange", "after_merge")


@dataclass
class ProjectionBounds:
    """y* [B, H, V] float64 and its per-element bound; the merged LSE g* [B, H] and its bound;
    ``allowance`` [B, H, V]: the part of the bound beyond the final half ulp (what the
    implementation's arithmetic and the intermediate rounding to T may use)."""

    order: str
    dtype: torch.dtype
    out: torch.Tensor
    out_bound: torch.Tensor
    allowance: torch.Tensor
    lse: torch.Tensor
    lse_bound: torch.Tensor


def _coeffs(dtype: torch.dtype) -> tuple[float, float, float, float]:
    """(u, dot_coeff, rounding_ulps, ftz_floor) of tolerances.yaml for output ``dtype``."""
    t = tol.load()
    up = t["up_projection"]
    return (float(t["fp32_unit_roundoff"]), float(up["dot_coeff"][tol.dtype_name(dtype)]),
            float(up["rounding_ulps"]), float(up["ftz_floor"]))


def _project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x[..., H, L] @ w[H, L, V] per head, float64 (NaN and inf propagate)."""
    return torch.einsum("...hl,hlv->...hv", x.to(torch.float64), w.to(torch.float64))


# Weaker designs out of the bound's scope (tolerances.yaml ``up_projection``): name ->
# (the merge's formulation, the dot's partial sums in the output dtype, what the verdict says)
WEAKER_PROJECTIONS = {
    "rounded_lse": ("rounded_lse", False, "merge with weights from the fp32-rounded merged LSE, "
                                          "exp(s_n - fl(g)), tolerances.yaml `rounded_lse`"),
    "dot_in_output_dtype": ("global_max", True, "projection whose partial sums round to the "
                                                "output dtype (a library matmul in it), "
                                                "tolerances.yaml `up_projection`"),
    "dot_in_output_dtype_rounded_lse": (
        "rounded_lse", True, "projection whose partial sums round to the output dtype (a "
                             "library matmul in it) and a merge with weights exp(s_n - fl(g)), "
                             "tolerances.yaml `up_projection` and `rounded_lse`"),
}


def _dot_coeff(dtype: torch.dtype, L: int, sums_in_output_dtype: bool) -> float | None:
    """The dot's relative allowance: c L u (fp32 sums), or gamma_L of the output dtype (None
    where L u_T >= 1: no bound)."""
    u, c, _, _ = _coeffs(dtype)
    if not sums_in_output_dtype:
        return c * L * u
    u_t = float(tol.load()["up_projection"]["output_unit_roundoff"][tol.dtype_name(dtype)])
    return L * u_t / (1 - L * u_t) if L * u_t < 1 else None


def projection_bounds(outputs: torch.Tensor, lses: torch.Tensor, w_uv: torch.Tensor,
                      dtype: torch.dtype | None = None, *, order: str,
                      is_lse_base_on_e: bool = True, kind: str = "a2a",
                      formulation: str = "global_max",
                      sums_in_output_dtype: bool = False) -> ProjectionBounds:
    """The float64 oracle of merging ``outputs[N, B, H, L]`` with ``lses[N, B, H]`` and
    projecting by ``w_uv[H, L, V]``, and the bound of ``order`` for a result of ``dtype``
    (default outputs.dtype), on the device of ``outputs`` (see the module and
    tolerances.yaml ``up_projection``). ``formulation`` and ``sums_in_output_dtype``: the
    bound of a weaker design instead (:data:`WEAKER_PROJECTIONS`); ValueError where that has
    no bound."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}: expected one of {', '.join(ORDERS)}")
    dtype = outputs.dtype if dtype is None else dtype
    _, _, half, ftz = _coeffs(dtype)
    n, _, _, L = outputs.shape
    dot = _dot_coeff(dtype, L, sums_in_output_dtype)
    if dot is None:
        raise ValueError(f"no bound for a dot of L={L} summed in {dtype}: L u_T >= 1")
    lses = lses.to(outputs.device)
    w = w_uv.to(outputs.device)
    w_abs = w.to(torch.float64).abs()
    latent = oracle_bounds(outputs, lses, dtype, kind=kind, is_lse_base_on_e=is_lse_base_on_e,
                           formulation=formulation)
    y = _project(latent.out, w)
    if order == "after_merge":
        beta = latent.out_bound
        allowance = (_project(beta, w_abs) + dot * _project(latent.out.abs() + beta, w_abs)
                     + L * ftz)
        bound = half * tol.ulp(y.abs() + allowance, dtype) + allowance
    else:
        finite = torch.isfinite(outputs)
        o = torch.where(finite, outputs.to(torch.float64), torch.zeros((), dtype=torch.float64,
                                                                      device=outputs.device))
        p = _project(o, w)  # [N, B, H, V]; ranks of weight 0 may hold NaN partials: masked below
        delta = dot * _project(o.abs(), w_abs) + L * ftz
        big = half * tol.ulp(p.abs() + delta, dtype) + delta  # |p_n - p*_n| per rank
        merged = oracle_bounds(p.abs() + big, lses, dtype, kind=kind,
                               is_lse_base_on_e=is_lse_base_on_e, formulation=formulation)
        weights = _weights(lses, is_lse_base_on_e)
        a = torch.where(weights[..., None] > 0, weights[..., None] * big,
                        torch.zeros_like(big)).sum(dim=0)
        e = merged.evaluation
        allowance = e + a + 2 * n * float(tol.load()["a2a"][tol.dtype_name(dtype)]["output"]
                                              ["ftz_floor"])
        if kind == "ag_rs":
            allowance = allowance + (tol.load()["ag_rs"]["sum_rounding_ulps_per_rank"] * n
                                     * tol.ulp(merged.mag, dtype))
        bound = half * tol.ulp(y.abs() + a + e, dtype) + allowance
    return ProjectionBounds(order, dtype, y, bound, allowance, latent.lse, latent.lse_bound)


def _weights(lses: torch.Tensor, is_lse_base_on_e: bool) -> torch.Tensor:
    from dcp_a2a.reference.combine import _weights as weights

    return weights(lses, is_lse_base_on_e)[0]


def weaker_projection(actual_out, actual_lse, outputs, lses, w_uv, **kwargs) -> str | None:
    """The first design of :data:`WEAKER_PROJECTIONS` within whose bound the result lies
    (``kwargs`` as for :func:`check_up_projection`), or None: its errors are wrong numbers."""
    for name, (formulation, in_t, _) in WEAKER_PROJECTIONS.items():
        try:
            rep = check_up_projection(actual_out, actual_lse, outputs, lses, w_uv,
                                      formulation=formulation, sums_in_output_dtype=in_t,
                                      **kwargs)
        except ValueError:  # no bound for this design at this L
            continue
        if rep.ok:
            return name
    return None


def check_up_projection(actual_out: torch.Tensor, actual_lse: torch.Tensor | None,
                        outputs: torch.Tensor, lses: torch.Tensor, w_uv: torch.Tensor, *,
                        order: str, is_lse_base_on_e: bool = True, kind: str = "a2a",
                        heads: slice | None = None, formulation: str = "global_max",
                        sums_in_output_dtype: bool = False) -> MergeReport:
    """Compare an up-projected result (``actual_out[B, H', V]``, H' the heads ``heads`` of
    ``outputs[N, B, H, L]``, and its float32 LSE or None) with the oracle; the bound of
    ``order`` (of a weaker design with ``formulation`` / ``sums_in_output_dtype``). The
    report's kind is ``up_projection/<order>``; ok when every element is within its bound."""
    dtype = actual_out.dtype
    lses = lses.to(outputs.device)
    if heads is not None:
        outputs, lses, w_uv = outputs[:, :, heads], lses[:, :, heads], w_uv[heads]
    orc = projection_bounds(outputs, lses, w_uv, dtype, order=order,
                            is_lse_base_on_e=is_lse_base_on_e, kind=kind,
                            formulation=formulation, sums_in_output_dtype=sums_in_output_dtype)
    if tuple(actual_out.shape) != tuple(orc.out.shape):
        raise AssertionError(f"output shape {tuple(actual_out.shape)} != {tuple(orc.out.shape)}")
    a, e, err = _errors(actual_out, orc.out)
    ulps = err / tol.ulp(e, dtype)
    up = tol.upstream(dtype)
    out_q = _quantity("output", a, e, err, orc.out_bound, ulps, up["output"])
    lse_q = None
    if actual_lse is not None:
        if tuple(actual_lse.shape) != tuple(orc.lse.shape):
            raise AssertionError(f"lse shape {tuple(actual_lse.shape)} != {tuple(orc.lse.shape)}")
        if actual_lse.dtype != torch.float32:
            raise AssertionError(f"returned lse must be float32, got {actual_lse.dtype}")
        la, le, lerr = _errors(actual_lse, orc.lse)
        lse_q = _quantity("lse", la, le, lerr, orc.lse_bound, None, up["lse"])
    rep = MergeReport(tol.dtype_name(dtype), outputs.shape[0], "e" if is_lse_base_on_e else "2",
                      f"up_projection/{order}", out_q, lse_q)
    rep.ulp_histogram = ulp_histogram(ulps)
    ratio = torch.where(err == 0, torch.zeros_like(err), err / orc.out_bound)
    rep.ratio_histogram = ulp_histogram(torch.nan_to_num(ratio, nan=1e300, posinf=1e300),
                                        RATIO_BIN_EDGES)
    return rep
