"""Device-side math shared by every kernel: a program's rows, the row mask and the LSE merge.

The merge of N attention states (o_n, s_n) is the LSE-weighted average

    g   = log  sum_n exp(s_n)              (log2 / exp2 when the LSE is base 2)
    o   = sum_n exp(s_n - g) * o_n

with the identity element s = -inf (weight 0). NaN and +inf LSEs are treated as -inf, and a
rank whose weight is 0 contributes exactly nothing, even when its o_n is NaN or inf. A row where
every rank is -inf merges to o = 0, g = -inf.

Every backend (packed, two_collective, ag_rs) computes its weights through ``merge_weights``;
that single routine is why packed and two_collective agree bit for bit.
"""

from __future__ import annotations

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before the kernels are defined)

import triton
import triton.language as tl

# Launch option for every kernel that does floating-point arithmetic: no multiply-add
# contraction. With contraction on, whether ``acc + w * x`` becomes one FMA is the compiler's
# choice per specialisation (it fused it where the loads were vectorised and not where they were
# not), so packed and two_collective -- same source, different strides -- differed in the last
# bit of float32 outputs on an H200. Without it every launch configuration computes exactly the
# operations written here, in the order written.
NO_CONTRACTION = {"enable_fp_fusion": False}


@triton.jit
def program_rows(B, H, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, WIDE: tl.constexpr,
                 HEAD_MAJOR: tl.constexpr = False):
    """The rows (token b, head h) of this program on the grid (cdiv(B, BLOCK_B),
    cdiv(H, BLOCK_H)), or (cdiv(H, BLOCK_H), cdiv(B, BLOCK_B)) with ``HEAD_MAJOR`` (programs
    launched one after another then walk a token's heads, not a head's tokens): BLOCK_B tokens
    x BLOCK_H heads (both powers of two), flattened as [BLOCK_B * BLOCK_H] vectors b, h and ok
    (the row exists). With BLOCK_B = 1, ``b`` is the scalar program id (no per-lane token
    arithmetic on the decode path). ``WIDE``: int64."""
    r = tl.arange(0, BLOCK_B * BLOCK_H)
    pid_b = tl.program_id(1 if HEAD_MAJOR else 0)
    pid_h = tl.program_id(0 if HEAD_MAJOR else 1)
    if BLOCK_B == 1:  # the grid has exactly B token columns
        b = pid_b
        h = pid_h * BLOCK_H + r
        ok = h < H
    else:
        b = pid_b * BLOCK_B + r // BLOCK_H
        h = pid_h * BLOCK_H + r % BLOCK_H
        ok = (b < B) & (h < H)
    if WIDE:
        b = b.to(tl.int64)
        h = h.to(tl.int64)
    return b, h, ok


@triton.jit
def row_is_empty(b, seq_lens_ptr, qsl_ptr, num_seqs, search_steps):
    """True where token row ``b`` (a scalar or a vector) has no local KV: its request's
    seq_len is 0, or the row is padding (at or beyond query_start_loc[-1], or before
    query_start_loc[0]).

    The request of row b is the last s with query_start_loc[s] <= b, found by a binary search of
    ``search_steps = ceil(log2(num_seqs))`` steps (requests with no query rows are skipped by it).
    """
    first = tl.load(qsl_ptr)
    total = tl.load(qsl_ptr + num_seqs)
    lo = b * 0
    hi = lo + num_seqs - 1
    for _ in range(search_steps):
        mid = (lo + hi + 1) // 2
        go = tl.load(qsl_ptr + mid) <= b
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
    seq_len = tl.load(seq_lens_ptr + lo, mask=lo < num_seqs, other=0)  # none: num_seqs == 0
    return (b >= total) | (b < first) | (seq_len <= 0)


@triton.jit
def _exp(x, BASE_E: tl.constexpr):
    if BASE_E:
        return tl.exp(x)
    else:
        return tl.exp2(x)


@triton.jit
def merge_weights(lses, N: tl.constexpr, BASE_E: tl.constexpr):
    """Normalised merge weights and merged LSE of N ranks' fp32 LSEs, ``lses`` a tuple of N
    [ROWS] vectors in rank order (masked-out rows loaded as -inf).

    Returns (scales, g): a tuple of N [ROWS] vectors, scale_n = exp(s_n - m) / sum_k
    exp(s_k - m) with m the row max (the global-max formulation), exactly 0 where the weight
    underflows or s_n is -inf/NaN/+inf; and g[ROWS] = m + log(sum). Every rounding happens in a
    fixed order: the max is exact in any order, and the sum runs over ranks 0, 1, ..., N-1 one
    addition at a time, so the result does not depend on how a launch configuration lays the
    rows out over threads. Each thread holds every rank's LSE of its rows, so nothing here
    crosses threads (a [N, ROWS] tile reduced over N was a chain of warp shuffles that the
    compiler put in front of the data loads).
    """
    clean = ()
    for r in tl.static_range(N):
        x = lses[r]
        clean = clean + (tl.where((x != x) | (x == float("inf")), float("-inf"), x),)
    m = clean[0]
    for r in tl.static_range(1, N):
        m = tl.maximum(m, clean[r])
    # Shift by the row max so the largest weight is exactly 1 and nothing overflows; an
    # all -inf row shifts by 0 so that exp gives 0 rather than exp(-inf - -inf) = NaN.
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = ()
    s = tl.zeros_like(m_safe)
    for r in tl.static_range(N):
        w_r = _exp(clean[r] - m_safe, BASE_E)
        w = w + (w_r,)
        s = s + w_r
    s_safe = tl.where(s > 0, s, 1.0)
    scales = ()
    for r in tl.static_range(N):
        scales = scales + (tl.where(w[r] > 0, w[r] / s_safe, 0.0),)
    if BASE_E:
        g = m + tl.log(s_safe)
    else:
        g = m + tl.log2(s_safe)
    return scales, g


@triton.jit
def weighted_term(scale_n, x):
    """scale_n * x with the identity guaranteed: a zero weight never lets a NaN/inf x in."""
    return tl.where(scale_n > 0, scale_n * x, 0.0)


@triton.jit
def add_weighted(acc, scale_n, x):
    """acc + scale_n * x in two roundings, a multiply and then an add (the kernels are compiled
    without FMA contraction, see ``NO_CONTRACTION``); a zero weight adds exactly nothing."""
    return acc + weighted_term(scale_n, x)


# bfloat16 conversions through integer bits. Triton's CPU interpreter truncates fp32 -> bf16,
# so the rounding to nearest, ties to even is written out in integer arithmetic: the CPU tier
# then tests the bits a GPU gives. Compiled for sm_80 or newer a kernel may instead pass
# ``NATIVE`` (its host decides, ``combine.native_bf16``): the hardware's conversion, which
# rounds the same way, with a NaN then set to 0x7FC0 as here (the hardware writes its own
# NaN); tests/gpu/test_native_bf16.py compares the two over every float32 bit pattern.
@triton.jit
def bf16_bits_to_f32(h):
    return (h.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def f32_to_bf16_bits(x, NATIVE: tl.constexpr = False):
    if NATIVE:
        r = x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.int16, bitcast=True)
        return tl.where(x != x, 0x7FC0, r).to(tl.int16)
    b = x.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16  # round to nearest, ties to even (carry ok)
    r = tl.where(x != x, 0x7FC0, r)  # any NaN -> the quiet NaN
    return (r & 0xFFFF).to(tl.int16)


@triton.jit
def f32x2_to_bf16x2_native(lo, hi):
    """Two float32 values rounded to bf16 (nearest, ties to even) in one 32-bit word, ``lo``
    in the low half: one sm_80 conversion instruction, then any NaN half set to 0x7FC0."""
    w = tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", [hi, lo],
                                  dtype=tl.int32, is_pure=True, pack=1)
    w = tl.where(lo != lo, (w & -65536) | 0x7FC0, w)
    return tl.where(hi != hi, (w & 0xFFFF) | 0x7FC00000, w)


@triton.jit
def load_f32(ptr, bits_ptr, offs, mask, IS_BF16: tl.constexpr):
    """Load float16/bfloat16/float32 values as fp32 (bf16 through its bits)."""
    if IS_BF16:
        return bf16_bits_to_f32(tl.load(bits_ptr + offs, mask=mask, other=0))
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_from_f32(ptr, bits_ptr, offs, y, mask, IS_BF16: tl.constexpr,
                   NATIVE: tl.constexpr = False):
    """Round fp32 ``y`` to the element type of ``ptr`` (nearest-even) and store it."""
    if IS_BF16:
        tl.store(bits_ptr + offs, f32_to_bf16_bits(y, NATIVE), mask=mask)
    else:
        tl.store(ptr + offs, y.to(ptr.dtype.element_ty), mask=mask)


# Two 16-bit values in one 32-bit word (the element at the lower address in the low half).
# Reading the wire as words halves the number of memory instructions: its rows (D+2 lanes) are
# 4-byte but never 16-byte aligned, so 4 bytes is the widest access it allows.
@triton.jit
def split_pair_f32(w, IS_BF16: tl.constexpr):
    if IS_BF16:
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & -65536).to(tl.float32, bitcast=True)
    else:
        lo = w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def join_pair_from_f32(lo, hi, IS_BF16: tl.constexpr, NATIVE: tl.constexpr = False):
    if NATIVE:  # bf16 only
        w = f32x2_to_bf16x2_native(lo, hi)
    else:
        if IS_BF16:
            lo_bits = f32_to_bf16_bits(lo)
            hi_bits = f32_to_bf16_bits(hi)
        else:
            lo_bits = lo.to(tl.float16).to(tl.int16, bitcast=True)
            hi_bits = hi.to(tl.float16).to(tl.int16, bitcast=True)
        w = (hi_bits.to(tl.int32) << 16) | (lo_bits.to(tl.int32) & 0xFFFF)
    return w
