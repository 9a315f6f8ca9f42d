"""Deliberately degraded merges (pure torch) that the error bound must reject on realistic
inputs, a correctly rounded merge it must accept, and an fp32 emulator of merge formulations
(the kernels' own arithmetic, flush-to-zero, adversarial exp errors, an online merge).

Each mutant takes per-rank partials ``outs[N, B, H, D]`` (output dtype T) and float32
``lses[N, B, H]`` and returns ``out[B, H, D]`` in T. They model the precision bugs a real
implementation can ship.

16-bit (``MUTANTS``; fp32-level errors are invisible under an ulp of T):

    weights_rounded   the normalised weights exp(s_n - g) stored in T before weighting
    truncated         the exact result cast to T by truncation (toward zero) instead of rounding
    lse_rounded       the LSE rounded to T before it is sent (e.g. packed into a T lane)

fp32-level (``MUTANTS_FP32``; visible on fp32 outputs with LSEs of 30-50, where u|s| is tens of
u, see test_bound.py; all in the GPU's arithmetic, tl.exp = ex2(fl(t * fl(log2 e)))):

    global_lse_weights    weights exp(fl(s_n - fl(g))) from an fp32-rounded global LSE g, not
                          normalised by their sum (vLLM's correct_attn_out, then a sum)
    no_max_subtraction    w_n = exp(s_n) without subtracting the max, normalised by the sum
    exp_8x_less_accurate  the global-max merge with an exp 8x less accurate than ex2.approx
                          (32u instead of 4u, the error's sign alternating with the rank)

Subnormal weights (``clamped_exponent``): shifts clamped at fp32's normal range (x >= ln 2^-126)
so that no weight is subnormal; every weight below 2^-126 becomes 2^-126, which the small-weight
floor (up to 100 % of a subnormal weight) must still reject.
"""

from __future__ import annotations

import math

import torch

from dcp_a2a.reference import lse_weighted_combine, sanitize_lse

F64 = torch.float64
TINY32 = 2.0 ** -126                            # smallest normal fp32; FTZ flushes below it
LOG2E_F32 = float(torch.tensor(math.log2(math.e), dtype=torch.float32))  # fl32(log2 e)
# ex2.approx.f32 is within 2 ulp (PTX ISA), 4u relative: the derivation's allowance per exp
EX2_APPROX_REL = 4 * 2.0 ** -24


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
    w = _weights(lses, base_e).to(outs.dtype).to(F64)
    return (w[..., None] * outs.to(F64)).sum(0).to(outs.dtype)


def truncate_to(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast to ``dtype`` rounding toward zero: round to nearest, then step back toward zero
    wherever that overshot in magnitude."""
    r = y.to(dtype)
    over = r.to(F64).abs() > y.to(F64).abs()
    return torch.where(over, torch.nextafter(r, torch.zeros_like(r)), r)


def truncated(outs, lses, base_e=True):
    y = lse_weighted_combine(outs, lses, is_lse_base_on_e=base_e).to(torch.float32)
    return truncate_to(y, outs.dtype)


def lse_rounded(outs, lses, base_e=True):
    return correctly_rounded(outs, lses.to(outs.dtype).to(torch.float32), base_e)


MUTANTS = {"weights_rounded": weights_rounded, "truncated": truncated,
           "lse_rounded": lse_rounded}


def clamped_exponent(outs, lses, base_e=True):
    """The exact merge with every shift clamped at fp32's normal range, x_n >= log(2^-126):
    no weight is subnormal, and the tiny ones are too large by up to a factor e^{-x_n} 2^-126."""
    s = sanitize_lse(lses)
    m = s.amax(0)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    lo = math.log(TINY32) if base_e else math.log2(TINY32)
    x = torch.where(torch.isinf(s), s, torch.clamp(s - m, min=lo))
    e = torch.exp(x) if base_e else torch.exp2(x)
    w = e / e.sum(0)
    o = outs.to(F64)
    terms = torch.where(w[..., None] > 0, w[..., None] * o, torch.zeros_like(o))
    return terms.sum(0).to(outs.dtype)


def subnormal_weight_inputs(dtype: torch.dtype, big: float):
    """A correct merge that a bound without the small-weight floor failed, ``(outs[2, 1, 2, 4] in dtype, lses[2, 1, 2] float32)``: rank 0
    at LSE 0 with a zero partial, rank 1 at LSE -95 / -100 (per head: weights e^-95 ~ 2^-137 and
    e^-100 ~ 2^-144, fp32 subnormals) with partial big * [1, 1.1, 1.3, 1.7]. The merge is
    rank 1's tiny share of a huge partial: the bound's relative terms do not cover a weight
    that fp32 holds to a few % or flushes to zero; the small-weight floor does."""
    if not math.isfinite(big) or big <= 0:
        raise ValueError(f"big must be a positive finite number, got {big}")
    outs = torch.zeros(2, 1, 2, 4, dtype=F64)
    outs[1] = big * torch.tensor([1.0, 1.1, 1.3, 1.7], dtype=F64)
    lses = torch.tensor([[[0.0, 0.0]], [[-95.0, -100.0]]], dtype=torch.float32)
    return outs.to(dtype), lses


def fp32_mutant_inputs(shape=(4, 2, 64, 64), *, seed: int = 11, spread: float = 1.0,
                       lo: float = 30.0, hi: float = 50.0):
    """Partials on which fp32-level mutants are visible: ``outs[N, B, H, D]`` ~ N(0, 1) float32
    and float32 ``lses[N, B, H]`` = a per-row offset uniform in [lo, hi) plus a per-rank
    N(0, spread^2). LSEs of 30-50 (long contexts, large logits) make u|s| tens of u, against a
    bound of u(2.25(|x| + X) + 2N + 11) that does not grow with |s|."""
    n, b, h, d = shape
    g = torch.Generator().manual_seed(seed)
    outs = torch.randn(n, b, h, d, generator=g).to(torch.float32)
    base = lo + (hi - lo) * torch.rand(1, b, h, generator=g)
    lses = (base + torch.randn(n, b, h, generator=g) * spread).to(torch.float32)
    return outs, lses


# ----------------------------------------------------------------------------------------------
# fp32 emulation. Values are float64 tensors holding fp32 numbers; every operation is computed in
# float64 and rounded once to fp32, which is the correctly rounded fp32 result for + - * /
# (53 >= 2 * 24 + 2 bits: double rounding is innocuous). exp/exp2/div take an optional relative
# error pushed in a chosen direction, to emulate approximate hardware adversarially.


class FP32:
    """fp32 arithmetic on float64 tensors, optionally flushing subnormal results to zero (as
    compiled GPU code may: ``ftz``). ``exp_error`` / ``div_error``: relative error of every
    exponential / division (0: correctly rounded), in the direction ``exp_sign`` /
    ``div_sign`` (+1, -1, or a tensor of signs broadcastable to the operands)."""

    def __init__(self, *, ftz: bool = False, exp_error: float = 0.0, exp_sign=1.0,
                 div_error: float = 0.0, div_sign=1.0):
        for name, v in (("exp_error", exp_error), ("div_error", div_error)):
            if not (0.0 <= v < 2.0 ** -10):
                raise ValueError(f"{name} must be a small relative error >= 0, got {v}")
        self.ftz, self.exp_error, self.exp_sign = ftz, exp_error, exp_sign
        self.div_error, self.div_sign = div_error, div_sign

    def fl(self, x: torch.Tensor) -> torch.Tensor:
        r = x.to(torch.float32).to(F64)
        if self.ftz:  # a subnormal result becomes a zero of the same sign
            r = torch.where(r.abs() < TINY32, r * 0.0, r)
        return r

    def _approx(self, exact: torch.Tensor, rel: float, sign) -> torch.Tensor:
        """An fp32 value within ``rel`` |exact| of ``exact`` (or the nearest, when that is
        farther), pushed toward ``sign``: exact (1 + sign rel) rounded, stepped one ulp back
        toward exact where rounding overshot."""
        if rel == 0.0:
            return self.fl(exact)
        sign = torch.as_tensor(sign, dtype=F64, device=exact.device)
        r32 = (exact * (1.0 + sign * rel)).to(torch.float32)
        near = exact.to(torch.float32)
        over = ((r32.to(F64) - exact).abs() > rel * exact.abs()) & (r32 != near)
        r32 = torch.where(over, torch.nextafter(r32, near), r32)
        return self.fl(r32.to(F64))

    def add(self, a, b):
        return self.fl(a + b)

    def mul(self, a, b):
        return self.fl(a * b)

    def div(self, a, b):
        return self._approx(a / b, self.div_error, self.div_sign)

    def exp(self, t, base_e: bool, sign=None):
        """tl.exp as the GPU computes it, ex2(fl(t * fl(log2 e))); tl.exp2 directly."""
        sign = self.exp_sign if sign is None else sign
        y = self.mul(t, torch.full_like(t, LOG2E_F32)) if base_e else t
        return self._approx(torch.exp2(y), self.exp_error, sign)

    def log(self, x, base_e: bool):
        return self.fl(torch.log(x) if base_e else torch.log2(x))


def _ranks(lses):
    s = sanitize_lse(lses)  # fp32 LSEs are exact in float64
    m = s.amax(0)
    return s, m, torch.where(torch.isinf(m), torch.zeros_like(m), m)


def _weighted_sum(ar, outs, scale):
    """sum_n scale_n o_n in rank order, one multiply and one add per rank; a zero weight adds
    nothing (not even a NaN partial). scale[N, B, H]."""
    o = ar.fl(outs.to(F64))
    acc = torch.zeros_like(o[0])
    for r in range(o.shape[0]):
        sc = scale[r][..., None]
        acc = ar.add(acc, torch.where(sc > 0, ar.mul(sc, o[r]), torch.zeros_like(acc)))
    return acc


def fp32_merge(outs: torch.Tensor, lses: torch.Tensor, base_e: bool = True, *,
               formulation: str = "global_max", arith: FP32 | None = None):
    """Emulate an fp32 merge of ``outs[N, B, H, D]`` (T) and ``lses[N, B, H]`` (float32):
    returns ``(out[B, H, D] in T, lse[B, H] float32)``.

    ``formulation``:
      global_max   the kernels' merge_weights: m = max, w = exp(fl(s - m)), s = sum in rank
                   order, scale = w / s, acc += scale * o (the bound's scope)
      divide_last  the same weights not normalised: acc += w * o, y = acc / s (the scope's
                   second form; its accumulator can overflow where global_max's cannot)
      online       running max: per rank k, m' = max(m, s_k), a = exp(fl(m - m')),
                   b = exp(fl(s_k - m')), l = a l + b, acc = a acc + b o_k; y = acc / l
                   (per-rank exp signs apply to step k's a and b)
      global_lse   vLLM's correct_attn_out: g = fl(m + log sum exp(s - m)), weights
                   exp(fl(s_n - g)) unnormalised, summed in rank order
      no_max       w = exp(s_n) without the max, scale = w / sum w
    ``arith`` the fp32 arithmetic (default: correctly rounded, no flush)."""
    ar = arith or FP32()
    if formulation not in ("global_max", "divide_last", "online", "global_lse", "no_max"):
        raise ValueError(f"unknown formulation {formulation!r}")
    if outs.dim() != 4 or lses.dim() != 3 or tuple(outs.shape[:3]) != tuple(lses.shape):
        raise ValueError(f"expected outs[N, B, H, D] and lses[N, B, H], got "
                         f"{tuple(outs.shape)} and {tuple(lses.shape)}")
    s, m, m_safe = _ranks(lses)
    n = s.shape[0]
    neg_inf = torch.full_like(m, -math.inf)
    if formulation == "online":
        sign = torch.as_tensor(ar.exp_sign, dtype=F64).expand(n, *([1] * m.dim()))
        o = ar.fl(outs.to(F64))
        mk, lk, acc = neg_inf.clone(), torch.zeros_like(m), torch.zeros_like(o[0])
        for k in range(n):
            m_new = torch.maximum(mk, s[k])
            ms = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            a = torch.where(torch.isinf(mk), torch.zeros_like(mk),
                            ar.exp(ar.add(mk, -ms), base_e, sign[k]))
            b = torch.where(torch.isinf(s[k]), torch.zeros_like(mk),
                            ar.exp(ar.add(s[k], -ms), base_e, sign[k]))
            lk = ar.add(ar.mul(a, lk), b)
            bo = torch.where(b[..., None] > 0, ar.mul(b[..., None], o[k]), torch.zeros_like(acc))
            acc = ar.add(ar.mul(a[..., None], acc), bo)
            mk = m_new
        ok = lk > 0
        l_safe = torch.where(ok, lk, torch.ones_like(lk))
        y = torch.where(ok[..., None], ar.div(acc, l_safe[..., None]), torch.zeros_like(acc))
        g = torch.where(ok, ar.add(mk, ar.log(l_safe, base_e)), neg_inf)
        return y.to(outs.dtype), g.to(torch.float32)
    if formulation == "no_max":
        w = ar.exp(s, base_e)  # exp(-inf) = 0
    else:
        w = ar.exp(ar.add(s, -m_safe), base_e)
    tot = torch.zeros_like(m)
    for r in range(n):
        tot = ar.add(tot, w[r])
    ok = tot > 0
    t_safe = torch.where(ok, tot, torch.ones_like(tot))
    g = torch.where(ok, ar.add(m_safe if formulation != "no_max" else 0.0 * m_safe,
                               ar.log(t_safe, base_e)), neg_inf)
    if formulation == "divide_last":
        acc = _weighted_sum(ar, outs, torch.where(w > 0, w, torch.zeros_like(w)))
        y = torch.where(ok[..., None], ar.div(acc, t_safe[..., None]), torch.zeros_like(acc))
        return y.to(outs.dtype), g.to(torch.float32)
    if formulation == "global_lse":
        g_safe = torch.where(ok, g, torch.zeros_like(g))
        scale = torch.where(torch.isinf(s), torch.zeros_like(s), ar.exp(ar.add(s, -g_safe), base_e))
    else:
        scale = torch.where(w > 0, ar.div(w, t_safe), torch.zeros_like(w))
    return _weighted_sum(ar, outs, scale).to(outs.dtype), g.to(torch.float32)


def global_lse_weights(outs, lses, base_e=True):
    return fp32_merge(outs, lses, base_e, formulation="global_lse")[0]


def no_max_subtraction(outs, lses, base_e=True):
    return fp32_merge(outs, lses, base_e, formulation="no_max")[0]


def exp_8x_less_accurate(outs, lses, base_e=True):
    n = lses.shape[0]
    sign = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0).to(F64).view(n, *[1] * (lses.dim() - 1))
    ar = FP32(exp_error=8 * EX2_APPROX_REL, exp_sign=sign)
    return fp32_merge(outs, lses, base_e, arith=ar)[0]


MUTANTS_FP32 = {"global_lse_weights": global_lse_weights,
                "no_max_subtraction": no_max_subtraction,
                "exp_8x_less_accurate": exp_8x_less_accurate}
