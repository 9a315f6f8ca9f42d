"""Per-element error bounds read from ``tolerances.yaml`` (see that file for the derivation).

``evaluation_bound``, ``output_bound_from`` and ``lse_bound`` turn the float64 oracle's
quantities into the largest error an implementation may make on each element. They are the
pieces: the one function that assembles them from the partials is
:func:`dcp_a2a.testing.compare.oracle_bounds`, which every check, report and composed bound uses.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import torch
import yaml

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
# (explicit mantissa bits, smallest normal exponent) of each output dtype
_FORMAT = {torch.float16: (10, -14), torch.bfloat16: (7, -126), torch.float32: (23, -126)}


def tolerances_path() -> Path:
    """``$DCP_A2A_TOLERANCES``, else the copy a wheel ships next to this module, else the one
    source at the top of the checkout (a checkout or an editable install)."""
    env = os.environ.get("DCP_A2A_TOLERANCES")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    shipped = here / "tolerances.yaml"
    return shipped if shipped.is_file() else here.parent.parent / "tolerances.yaml"


@functools.lru_cache(maxsize=None)
def load(path: str | None = None) -> dict:
    p = Path(path) if path else tolerances_path()
    if not p.is_file():
        raise FileNotFoundError(f"tolerances file not found: {p} (set DCP_A2A_TOLERANCES)")
    with open(p) as f:
        return yaml.safe_load(f)


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"no tolerance for dtype {dtype}") from None


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at |x| (float64 in, float64 out); the subnormal spacing below the
    normal range, +inf for non-finite x."""
    mant, emin = _FORMAT[dtype]
    a = x.to(torch.float64).abs()
    _, e = torch.frexp(a)  # a = f * 2^e, f in [0.5, 1)
    exp = torch.clamp(e.to(torch.float64) - 1.0, min=float(emin))
    sp = torch.exp2(exp - mant)
    return torch.where(torch.isfinite(a), sp, torch.full_like(a, float("inf")))


FORMULATIONS = ("global_max", "online", "rounded_lse")
KINDS = ("a2a", "ag_rs")


def _check_choice(what: str, value: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")


def _coeffs(dtype: torch.dtype, formulation: str) -> dict:
    """The output coefficients (shift_coeff, rank_coeff, constant) of ``formulation``."""
    _check_choice("formulation", formulation, FORMULATIONS)
    t = load()
    if formulation in ("online", "rounded_lse"):
        return t[formulation]["output"]
    return t["a2a"][dtype_name(dtype)]["output"]


def evaluation_bound(magnitude: torch.Tensor, shift_magnitude: torch.Tensor,
                     mean_shift: torch.Tensor, dtype: torch.dtype, world_size: int,
                     small_weight_magnitude: torch.Tensor | float = 0.0,
                     formulation: str = "global_max",
                     lse: torch.Tensor | None = None) -> torch.Tensor:
    """E: the bound on the fp32 evaluation error of the merge before the final rounding to
    ``dtype`` (float64 [B, H, D]), ``u * (shift_coeff * (S + X * M) + (rank_coeff * N +
    constant) * M) + F``: the part of :func:`output_bound_from` an implementation's arithmetic
    controls.

    ``magnitude`` M and ``shift_magnitude`` S are [B, H, D] (``reference.combine_magnitude``),
    ``mean_shift`` X is [B, H] (``reference.mean_shift``), ``small_weight_magnitude`` F is
    [B, H, D] or 0 (``reference.small_weight_magnitude``)."""
    c = _coeffs(dtype, formulation)
    u = load()["fp32_unit_roundoff"]
    x = torch.as_tensor(mean_shift, dtype=torch.float64, device=magnitude.device)
    if x.dim() == magnitude.dim() - 1:
        x = x[..., None]  # one X per row, M per element
    if formulation == "rounded_lse":  # weights from fl(g): the classification bound only
        if lse is None:
            raise ValueError("the rounded_lse formulation's bound needs the merged LSE g*")
        g = torch.as_tensor(lse, dtype=torch.float64, device=magnitude.device)
        g = torch.where(torch.isfinite(g), g.abs(), torch.zeros_like(g))
        if g.dim() == magnitude.dim() - 1:
            g = g[..., None]
        return (u * (c["shift_coeff"] * shift_magnitude
                     + (c["g_coeff"] * g + c["mean_shift_coeff"] * x
                        + c["rank_coeff"] * world_size
                        + c["log_rank_coeff"] * math.log(world_size) + c["constant"])
                     * magnitude) + small_weight_magnitude)
    return (u * (c["shift_coeff"] * (shift_magnitude + x * magnitude)
                 + (c["rank_coeff"] * world_size + c["constant"]) * magnitude)
            + small_weight_magnitude)


def small_weight_limits() -> tuple[float, float]:
    """(below, at_least) of the small-weight floor: ranks whose exact weight is below ``below``
    (fp32's smallest normal) count with max(w_n, ``at_least``) |o_n| (see tolerances.yaml)."""
    f = load()["small_weight_floor"]
    return float(f["below"]), float(f["at_least"])


def output_bound_from(ref: torch.Tensor, evaluation: torch.Tensor, magnitude: torch.Tensor,
                      dtype: torch.dtype, world_size: int, kind: str = "a2a") -> torch.Tensor:
    """Per-element bound on |y - y*| (float64, shape of ``ref``) from the evaluation bound E
    (:func:`evaluation_bound`): ``rounding_ulps * ulp_T(|y*| + E) + E + 2N * ftz_floor``, plus
    ``N * ulp_T(M)`` for ``kind`` "ag_rs". Callers get it through
    ``dcp_a2a.testing.compare.oracle_bounds``, which computes E from the partials."""
    _check_choice("bound kind", kind, KINDS)
    c = load()["a2a"][dtype_name(dtype)]["output"]
    # up to 2N fp32 products and partial sums may be flushed to zero on the GPU
    bound = (c["rounding_ulps"] * ulp(ref.abs() + evaluation, dtype) + evaluation
             + 2 * world_size * c["ftz_floor"])
    if kind == "ag_rs":
        k = load()["ag_rs"]["sum_rounding_ulps_per_rank"]
        bound = bound + k * world_size * ulp(magnitude, dtype)
    return bound


def lse_bound(ref_lse: torch.Tensor, mean_shift: torch.Tensor, dtype: torch.dtype,
              world_size: int, is_lse_base_on_e: bool,
              formulation: str = "global_max") -> torch.Tensor:
    """Per-element bound on |g - g*| for the returned float32 LSE (float64 [B, H]), from the
    oracle's g* [B, H] and X [B, H] (``reference.mean_shift``)."""
    _check_choice("formulation", formulation, FORMULATIONS)
    t = load()
    top = t["online"] if formulation == "online" else t["a2a"][dtype_name(dtype)]
    # rounded_lse: the merged LSE is computed as in the global-max formulation
    c = top["lse"]["base_e" if is_lse_base_on_e else "base_2"]
    u = t["fp32_unit_roundoff"]
    g = torch.where(torch.isfinite(ref_lse), ref_lse.abs(), torch.zeros_like(ref_lse))
    return u * (c["g_coeff"] * g + c["shift_coeff"] * mean_shift
                + c["rank_coeff"] * world_size + c["log_rank_coeff"] * math.log(world_size)
                + c["constant"])


def overflow_threshold(dtype: torch.dtype) -> float:
    """The least magnitude that rounds to inf in ``dtype``: its largest finite value plus half
    an ulp there (fp32 2^128 - 2^103, bf16 2^128 - 2^119, fp16 65520)."""
    mant, _ = _FORMAT[dtype]
    top = torch.finfo(dtype).max
    return float(top) + 0.5 * math.ldexp(1.0, math.frexp(top)[1] - 1 - mant)


def overflow_reach() -> float:
    """Multiple of the output bound within which y* must be of the overflow threshold for an
    infinite result (of y*'s sign) to be accepted (tolerances.yaml ``overflow``)."""
    return float(load()["overflow"]["reach"])


def upstream(dtype: torch.dtype) -> dict:
    """The upstream vLLM PR #41160 atol=rtol values, for side-by-side reporting only."""
    return dict(load()["upstream_vllm_pr41160"][dtype_name(dtype)])
