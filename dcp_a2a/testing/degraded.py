"""Deliberately degraded merges (pure torch, built on the float64 oracle) that the error bound
must reject on realistic inputs, and a correctly rounded merge it must accept.

Each takes per-rank partials ``outs[N, B, H, D]`` (output dtype T) and float32 ``lses[N, B, H]``
and returns ``out[B, H, D]`` in T. They model the precision bugs a real implementation can ship:

    weights_rounded   the normalised weights exp(s_n - g) stored in T before weighting
    truncated         the exact result cast to T by truncation (toward zero) instead of rounding
    lse_rounded       the LSE rounded to T before it is sent (e.g. packed into a T lane)
"""

from __future__ import annotations

import torch

from dcp_a2a.reference import lse_weighted_combine, sanitize_lse


def _weights(lses, base_e):
    s = sanitize_lse(lses)
    m = s.amax(0)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m) if base_e else torch.exp2(s - m)
    return e / e.sum(0)


def correctly_rounded(outs, lses, base_e=True):
    """The float64 oracle rounded once to T: the best any implementation can do."""
    return lse_weighted_combine(outs, lses, is_lse_base_on_e=base_e).to(outs.dtype)


def weights_rounded(outs, lses, base_e=True):
    w = _weights(lses, base_e).to(outs.dtype).to(torch.float64)
    return (w[..., None] * outs.to(torch.float64)).sum(0).to(outs.dtype)


def truncate_to(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast to ``dtype`` rounding toward zero: round to nearest, then step back toward zero
    wherever that overshot in magnitude."""
    r = y.to(dtype)
    over = r.to(torch.float64).abs() > y.to(torch.float64).abs()
    return torch.where(over, torch.nextafter(r, torch.zeros_like(r)), r)


def truncated(outs, lses, base_e=True):
    y = lse_weighted_combine(outs, lses, is_lse_base_on_e=base_e).to(torch.float32)
    return truncate_to(y, outs.dtype)


def lse_rounded(outs, lses, base_e=True):
    return correctly_rounded(outs, lses.to(outs.dtype).to(torch.float32), base_e)


MUTANTS = {"weights_rounded": weights_rounded, "truncated": truncated,
           "lse_rounded": lse_rounded}
