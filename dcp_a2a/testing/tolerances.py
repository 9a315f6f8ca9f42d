"""Per-element error bounds read from ``tolerances.yaml`` (see that file for the derivation).

``output_bound`` and ``lse_bound`` turn the float64 oracle's quantities into the largest error
an implementation may make on each element; :mod:`dcp_a2a.testing.compare` reports errors against them.
"""

from __future__ import annotations

import functools
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


def evaluation_bound(magnitude: torch.Tensor, shift_magnitude: torch.Tensor,
                     dtype: torch.dtype, world_size: int) -> torch.Tensor:
    """E: the bound on the fp32 evaluation error of the merge, before the final rounding to
    ``dtype`` (float64), ``u * (shift_coeff * shift_magnitude + (rank_coeff * N + constant) *
    magnitude)``. The part of :func:`output_bound` an implementation's arithmetic controls."""
    t = load()
    c = t["a2a"][dtype_name(dtype)]["output"]
    u = t["fp32_unit_roundoff"]
    return u * (c["shift_coeff"] * shift_magnitude
                + (c["rank_coeff"] * world_size + c["constant"]) * magnitude)


def small_weight_limits() -> tuple[float, float]:
    """(below, at_least) of the small-weight floor: ranks whose exact weight is below ``below``
    (fp32's smallest normal) count with max(w_n, ``at_least``) |o_n| (see tolerances.yaml)."""
    f = load()["small_weight_floor"]
    return float(f["below"]), float(f["at_least"])


def output_bound(ref: torch.Tensor, magnitude: torch.Tensor, shift_magnitude: torch.Tensor,
                 dtype: torch.dtype, world_size: int, kind: str = "a2a",
                 small_weight_magnitude: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Per-element bound on |y - y*| (float64) for output dtype ``dtype``.

    ``magnitude`` = sum_n w_n|o_n|, ``shift_magnitude`` = sum_n w_n|o_n||x_n| (from
    ``reference.combine_magnitude``), ``small_weight_magnitude`` = sum over ranks of subnormal
    weight of max(w_n, 2^-149)|o_n| (``reference.small_weight_magnitude``); ``kind`` is "a2a" or
    "ag_rs".
    """
    c = load()["a2a"][dtype_name(dtype)]["output"]
    e = evaluation_bound(magnitude, shift_magnitude, dtype, world_size) + small_weight_magnitude
    # up to 2N fp32 products and partial sums may be flushed to zero on the GPU
    bound = c["rounding_ulps"] * ulp(ref.abs() + e, dtype) + e + 2 * world_size * c["ftz_floor"]
    if kind == "ag_rs":
        k = load()["ag_rs"]["sum_rounding_ulps_per_rank"]
        bound = bound + k * world_size * ulp(magnitude, dtype)
    elif kind != "a2a":
        raise ValueError(f"unknown bound kind {kind!r}")
    return bound


def lse_bound(ref_lse: torch.Tensor, dtype: torch.dtype, world_size: int,
              is_lse_base_on_e: bool) -> torch.Tensor:
    """Per-element bound on |g - g*| for the returned float32 LSE."""
    t = load()
    c = t["a2a"][dtype_name(dtype)]["lse"]["base_e" if is_lse_base_on_e else "base_2"]
    u = t["fp32_unit_roundoff"]
    g = torch.where(torch.isfinite(ref_lse), ref_lse.abs(), torch.zeros_like(ref_lse))
    return u * (c["g_coeff"] * g + c["rank_coeff"] * world_size + c["constant"])


def upstream(dtype: torch.dtype) -> dict:
    """The upstream vLLM PR #41160 atol=rtol values, for side-by-side reporting only."""
    return dict(load()["upstream_vllm_pr41160"][dtype_name(dtype)])
