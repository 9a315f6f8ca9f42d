"""Triton's CPU interpreter rounds float32 -> bfloat16 as a GPU does, for every kernel the suite
runs (the implementation under test's included).

The interpreter converts float32 to bfloat16 by truncating the low 16 bits (and its "rtne" mode
adds the cut-off bit without ties-to-even or a carry into the exponent), where a GPU's
conversion (``cvt.rn.bf16.f32``: every implicit conversion of a store, ``.to(tl.bfloat16)``)
rounds to nearest, ties to even. A correct Triton merge of another engine then comes out up to
one bf16 ulp off on the CPU tier and fails a bound that assumes half an ulp: a verdict on the
interpreter, not on the implementation. :func:`round_bf16_like_gpu` replaces the interpreter's
float32 -> bfloat16 conversion with the GPU's (round to nearest even; any NaN the quiet NaN
0x7FC0, as the hardware writes it); an explicit round-toward-zero request keeps truncating. Every
other conversion is the interpreter's own.

The project's own kernels round through integer bits (``kernels.merge_math``) and are unaffected.
"""

from __future__ import annotations

import os

import numpy as np

_PATCHED = "_dcp_a2a_rounds_bf16_like_gpu"


def interpreting() -> bool:
    """Whether Triton kernels defined from now on run in the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def f32_bits_to_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """uint32 float32 bit patterns -> uint16 bfloat16 bit patterns, round to nearest, ties to even
    (a carry into the exponent rounds up to the next binade or to inf); NaN -> 0x7FC0."""
    b = bits.astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32) & 0xFFFF
    nan = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)
    return np.where(nan, np.uint32(0x7FC0), rounded).astype(np.uint16)


def round_bf16_like_gpu() -> bool:
    """Patch the interpreter's float32 -> bfloat16 conversion (idempotent). False when Triton's
    interpreter is not importable or its conversion is not where this Triton keeps it (then
    nothing is changed and the CPU tier names the interpreter's truncation instead)."""
    try:
        from triton.runtime import interpreter as ti
        import triton.language as tl
        from triton._C.libtriton import ir
    except ImportError:
        return False
    original = getattr(ti, "_convert_float", None)
    if original is None:
        return False
    if getattr(original, _PATCHED, False):
        return True
    rtz = getattr(getattr(ir, "ROUNDING_MODE", None), "RTZ", object())

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        if (input_dtype == tl.float32 and output_dtype == tl.bfloat16
                and rounding_mode != rtz):
            bits = np.frombuffer(np.ascontiguousarray(input).tobytes(), dtype=np.uint32)
            return f32_bits_to_bf16_bits(bits).reshape(np.shape(input))
        return original(input, input_dtype, output_dtype, rounding_mode)

    setattr(convert_float, _PATCHED, True)
    ti._convert_float = convert_float
    return True


def bf16_rounding() -> str:
    """How this process's interpreter rounds float32 -> bfloat16, for reports."""
    if not interpreting():
        return "compiled (the GPU's conversion)"
    try:
        from triton.runtime import interpreter as ti
    except ImportError:
        return "no Triton interpreter"
    if getattr(getattr(ti, "_convert_float", None), _PATCHED, False):
        return "interpreter, rounded to nearest even as a GPU does"
    return "interpreter, truncated (not a GPU's rounding: bf16 results may be 1 ulp low)"
