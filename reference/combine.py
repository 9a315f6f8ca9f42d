"""The LSE-weighted merge in float64: the oracle every implementation is judged against.

    g = log sum_n exp(s_n),   o = sum_n exp(s_n - g) * o_n       (base 2: log2 / exp2)

NaN and +inf LSEs count as -inf; a rank of weight 0 contributes nothing (even a NaN o_n); a row
with every rank at -inf merges to o = 0, g = -inf.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def sanitize_lse(lses: torch.Tensor) -> torch.Tensor:
    """float64 copy with NaN and +inf replaced by -inf."""
    s = lses.to(torch.float64)
    return torch.where(torch.isnan(s) | (s == math.inf), torch.full_like(s, -math.inf), s)


def _unnormalised(lses: torch.Tensor, is_lse_base_on_e: bool):
    """(e^{x_n} [N, B, H], x_n = s_n - max_k s_k, the row max m with 0 for a row of -inf),
    float64; e^{x_n} is 0 where s_n is -inf."""
    s = sanitize_lse(lses)
    m = s.amax(dim=0)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    shifted = s - m_safe
    return (torch.exp(shifted) if is_lse_base_on_e else torch.exp2(shifted)), shifted, m_safe


def _weights(lses: torch.Tensor, is_lse_base_on_e: bool, with_shift: bool = False):
    """Normalised weights w[N, B, H] (float64) and the merged LSE g[B, H] (and, when asked,
    the shifts x_n = s_n - max_k s_k, 0 where s_n is -inf)."""
    e, shifted, m_safe = _unnormalised(lses, is_lse_base_on_e)
    total = e.sum(dim=0)
    w = torch.where(total > 0, e / torch.where(total > 0, total, torch.ones_like(total)), 0.0)
    log = torch.log if is_lse_base_on_e else torch.log2
    g = torch.where(total > 0, m_safe + log(torch.where(total > 0, total, torch.ones_like(total))),
                    torch.full_like(m_safe, -math.inf))
    if with_shift:
        return w, g, torch.where(torch.isinf(shifted), torch.zeros_like(shifted), shifted)
    return w, g


def _check_lses(lses: torch.Tensor) -> None:
    """lses[N, B, H], floating point: a clear error otherwise."""
    if not isinstance(lses, torch.Tensor) or not lses.dtype.is_floating_point:
        raise TypeError(f"lses must be a floating-point torch.Tensor, got {lses!r:.60}")
    if lses.dim() != 3:
        raise ValueError(f"expected lses[N, B, H], got {tuple(lses.shape)}")


def _check_pair(outputs: torch.Tensor, lses: torch.Tensor) -> None:
    """outputs[N, B, H, D] and lses[N, B, H], both floating point: a clear error otherwise."""
    for name, t in (("outputs", outputs), ("lses", lses)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    if outputs.dim() != 4 or lses.dim() != 3 or tuple(outputs.shape[:3]) != tuple(lses.shape):
        raise ValueError(
            f"expected outputs[N, B, H, D] and lses[N, B, H], got {tuple(outputs.shape)} and "
            f"{tuple(lses.shape)}"
        )


def lse_weighted_combine(outputs: torch.Tensor, lses: torch.Tensor, return_lse: bool = False,
                         is_lse_base_on_e: bool = True):
    """Merge ``outputs[N, B, H, D]`` with ``lses[N, B, H]`` in float64.

    Returns ``out[B, H, D]`` float64, and ``(out, lse[B, H] float64)`` when ``return_lse``.
    """
    _check_pair(outputs, lses)
    w, g = _weights(lses, is_lse_base_on_e)
    x = outputs.to(torch.float64)
    terms = torch.where(w[..., None] > 0, w[..., None] * x, torch.zeros_like(x))
    out = terms.sum(dim=0)
    return (out, g) if return_lse else out


def combine_magnitude(outputs: torch.Tensor, lses: torch.Tensor,
                      is_lse_base_on_e: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_n w_n |o_n|, sum_n w_n |o_n| |x_n|), float64 [B, H, D] each, x_n = s_n - max s.

    The scales of the rounding error an fp32 evaluation of the merge can make: the error bound
    in tolerances.yaml is a combination of the two (the second because a weight exp(x_n) computed
    from a rounded x_n carries a relative error proportional to |x_n|)."""
    _check_pair(outputs, lses)
    w, _, shift = _weights(lses, is_lse_base_on_e, with_shift=True)
    x = outputs.to(torch.float64).abs()
    wx = torch.where(w[..., None] > 0, w[..., None] * x, torch.zeros_like(x))
    return wx.sum(dim=0), (wx * shift.abs()[..., None]).sum(dim=0)


def mean_shift(lses: torch.Tensor, is_lse_base_on_e: bool = True) -> torch.Tensor:
    """X = sum_n w_n |x_n| per row, float64 [B, H] (x_n = s_n - max s in the LSE's units; 0 for
    a row of -inf): the weighted mean of the shift errors, which normalising by the sum of the
    weights spreads over every rank. X <= min((N-1)/e, ln N) nats (each w|x| <= 1/e; and
    X = H(w) - ln sum_k e^{x_k} <= ln N, the entropy bound; base 2: both over ln 2); the exact
    value is tighter than either."""
    _check_lses(lses)
    w, _, shift = _weights(lses, is_lse_base_on_e, with_shift=True)
    return (w * shift.abs()).sum(dim=0)


def weight_total(lses: torch.Tensor, is_lse_base_on_e: bool = True) -> torch.Tensor:
    """s = sum_n e^{x_n} per row, float64 [B, H] (x_n = s_n - max s, base 2 with exp2; between 1
    and N, 0 for a row of -inf): the sum of the unnormalised weights. A merge that accumulates
    sum_n e^{x_n} o_n and divides by s last has partial sums up to s * sum_n w_n |o_n|, s times
    the normalised merge's: where that reaches float32's overflow threshold it can round to inf
    (tolerances.yaml, ``overflow``)."""
    _check_lses(lses)
    return _unnormalised(lses, is_lse_base_on_e)[0].sum(dim=0)


def small_weight_magnitude(outputs: torch.Tensor, lses: torch.Tensor, is_lse_base_on_e: bool,
                           below: float, at_least: float) -> torch.Tensor:
    """sum over ranks whose exact weight w_n is below ``below`` of max(w_n, at_least) * |o_n|
    (float64 [B, H, D]): what weights in fp32's subnormal range, computed with up to 100 %
    relative error or flushed to zero, can move the merge by."""
    _check_pair(outputs, lses)
    if not (0.0 < at_least <= below):
        raise ValueError(f"need 0 < at_least <= below, got at_least={at_least}, below={below}")
    w, _ = _weights(lses, is_lse_base_on_e)
    # a finite LSE has a positive exact weight, even where float64 underflows it to 0
    tiny = torch.isfinite(sanitize_lse(lses)) & (w < below)
    x = outputs.to(torch.float64).abs()
    per = torch.where(tiny[..., None] & torch.isfinite(x),
                      torch.clamp(w, min=at_least)[..., None] * x, torch.zeros_like(x))
    return per.sum(dim=0)


def logsumexp_oracle(lses: torch.Tensor, is_lse_base_on_e: bool = True) -> torch.Tensor:
    """Merged LSE over axis 0 through scipy.special.logsumexp: an oracle independent of the
    torch code above (NaN/+inf count as -inf, as in the contract)."""
    from scipy.special import logsumexp  # here: scipy costs every importer (each rank) ~1 s

    s = sanitize_lse(lses).cpu().numpy()
    if not is_lse_base_on_e:
        s = s * math.log(2.0)
    with np.errstate(divide="ignore"):
        g = logsumexp(s, axis=0)
    if not is_lse_base_on_e:
        g = g / math.log(2.0)
    return torch.from_numpy(np.asarray(g, dtype=np.float64))
