"""The MLA up-projection of attention outputs, head by head: ``y[b, h, :] = x[b, h, :] @ w[h]``.

``x[B, Hs, L]`` (the latent attention output of Hs heads), ``w[Hs, L, V]`` (W_UV of those
heads, vLLM's layout), ``y[B, Hs, V]``; all three in one dtype (fp16, bf16 or fp32), any
strides. Each output element is one dot product of length L accumulated in fp32 and rounded
once to the output dtype (nearest even):

* 16-bit inputs, compiled: ``tl.dot`` on the tensor cores (the products of two 16-bit values
  are exact in fp32; the accumulation is fp32);
* fp32 inputs: ``tl.dot`` with ``input_precision="ieee"`` (never TF32: its 10-bit inputs would
  break the bound in tolerances.yaml ``up_projection``);
* the interpreter: the 16-bit inputs converted to fp32 exactly, then fp32 products summed
  over L (numpy's own order: any order of fp32 additions is within the bound).

Nothing here depends on a global setting (torch's TF32 or reduced-precision-reduction flags),
which is why the projection is a kernel of its own and not ``torch.bmm``.

The launcher trusts its input: :func:`dcp_a2a.lse_reduce` checks it first.
"""

from __future__ import annotations

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before the kernels are defined)

import torch
import triton
import triton.language as tl

from ._host import bits, next_pow2
from .launch import launch
from .merge_math import NO_CONTRACTION, bf16_bits_to_f32, store_from_f32


@triton.jit
def _load_tile(ptr, bits_ptr, offs, mask, IS_BF16: tl.constexpr, NATIVE: tl.constexpr):
    """A tile as the dot takes it: in its own 16-bit type (NATIVE: the compiled tensor-core
    path), else as exact fp32 values (bf16 through its bits: the interpreter keeps bf16 as raw
    integers, which its dot would multiply as integers)."""
    if NATIVE:
        return tl.load(ptr + offs, mask=mask, other=0.0)
    elif IS_BF16:
        return bf16_bits_to_f32(tl.load(bits_ptr + offs, mask=mask, other=0))
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _project_kernel(
    x_ptr, x_bits_ptr, w_ptr, w_bits_ptr, y_ptr, y_bits_ptr,
    B, L, V,
    s_xb, s_xh, s_xl, s_wh, s_wl, s_wv, s_yb, s_yh, s_yv,
    IS_BF16: tl.constexpr, NATIVE: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (token block, head, value block): y[m, h, n] = sum_k x[m, h, k] w[h, k, n]."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    pid_n = tl.program_id(2)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if WIDE:
        m = m.to(tl.int64)
        n = n.to(tl.int64)
        h = h.to(tl.int64)
    mm = m < B
    mn = n < V
    x_row = h * s_xh + m * s_xb
    w_col = h * s_wh + n * s_wv
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, L, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mk = k < L
        a = _load_tile(x_ptr, x_bits_ptr, x_row[:, None] + k[None, :] * s_xl,
                       mm[:, None] & mk[None, :], IS_BF16, NATIVE)
        b = _load_tile(w_ptr, w_bits_ptr, k[:, None] * s_wl + w_col[None, :],
                       mk[:, None] & mn[None, :], IS_BF16, NATIVE)
        if NATIVE:
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee")
    offs = (m * s_yb + h * s_yh)[:, None] + n[None, :] * s_yv
    store_from_f32(y_ptr, y_bits_ptr, offs, acc, mm[:, None] & mn[None, :], IS_BF16)


@triton.jit
def _project_heads_kernel(
    x_ptr, x_bits_ptr, w_ptr, w_bits_ptr, y_ptr, y_bits_ptr,
    B, H, L, V,
    s_xb, s_xh, s_xl, s_wh, s_wl, s_wv, s_yb, s_yh, s_yv,
    IS_BF16: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The interpreter's form: BLOCK_H heads of all tokens a program, whole heads (one step
    over L and V), fp32 products summed over L. The interpreter runs each operation of a
    program as numpy calls, so its time is the number of programs and of operations (its dot
    is numpy's matmul without BLAS: 25 ms a 16x512x128), not the arithmetic."""
    h = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    mh = h < H
    x_offs = h[:, None, None] * s_xh + m[None, :, None] * s_xb + k[None, None, :] * s_xl
    x_ok = mh[:, None, None] & (m < B)[None, :, None] & (k < L)[None, None, :]
    w_offs = h[:, None, None] * s_wh + k[None, :, None] * s_wl + n[None, None, :] * s_wv
    w_ok = mh[:, None, None] & (k < L)[None, :, None] & (n < V)[None, None, :]
    a = _load_tile(x_ptr, x_bits_ptr, x_offs, x_ok, IS_BF16, False)
    b = _load_tile(w_ptr, w_bits_ptr, w_offs, w_ok, IS_BF16, False)
    acc = tl.sum(a[:, :, :, None] * b[:, None, :, :], axis=2)
    y_offs = h[:, None, None] * s_yh + m[None, :, None] * s_yb + n[None, None, :] * s_yv
    y_ok = mh[:, None, None] & (m < B)[None, :, None] & (n < V)[None, None, :]
    store_from_f32(y_ptr, y_bits_ptr, y_offs, acc, y_ok, IS_BF16)


def _needs_int64(*tensors) -> bool:
    for t in tensors:
        if t.numel() and sum((s - 1) * st for s, st in zip(t.shape, t.stride())) >= 1 << 31:
            return True
    return False


# Block sizes: tl.dot needs every dim >= 16. A token block of up to 64 rows (decode batches of
# 1..16 tokens waste at most 15/16 of a 16-row MMA tile, where the time is W's bytes anyway), a
# value block of up to 128 lanes (MLA's V = 128: one block), K in steps of 64 (32 at fp32, whose
# ieee dot holds its operands in registers). A minimal rule of its own: this kernel is not in
# the launch table (kernels/tuning.py).
def _blocks(B: int, V: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    block_m = min(64, max(16, next_pow2(B)))
    block_n = min(128, max(16, next_pow2(V)))
    block_k = 32 if dtype == torch.float32 else 64
    warps = 4 if block_m * block_n <= 64 * 64 else 8
    return block_m, block_n, block_k, warps


# The interpreter's products of a program: BLOCK_H x tokens x L x V fp32 values at most this
# many (numpy temporaries of 4 MB); more tokens go in several launches.
_INTERPRETER_ELEMENTS = 1 << 20  # also Triton's largest tile


def _project_interpreted(x, w, y) -> None:
    B, Hs, L = x.shape
    V = w.shape[2]
    lk, ln = next_pow2(L), next_pow2(V)
    rows = max(1, min(next_pow2(B), _INTERPRETER_ELEMENTS // (lk * ln)))
    for b0 in range(0, B, rows):
        xb, yb = x[b0:b0 + rows], y[b0:b0 + rows]
        bm = next_pow2(xb.shape[0])
        bh = max(1, min(next_pow2(Hs), _INTERPRETER_ELEMENTS // (bm * lk * ln)))
        launch(_project_heads_kernel, (triton.cdiv(Hs, bh),), xb, bits(xb), w, bits(w), yb,
               bits(yb), xb.shape[0], Hs, L, V, *xb.stride(), *w.stride(), *yb.stride(),
               IS_BF16=x.dtype == torch.bfloat16, BLOCK_H=bh, BLOCK_M=bm, BLOCK_N=ln,
               BLOCK_K=lk)


def project(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y[b, h] = x[b, h] @ w[h]`` for ``x[B, Hs, L]``, ``w[Hs, L, V]``, ``y[B, Hs, V]`` of
    one dtype on one device (any strides; y must not overlap x or w). Returns ``y``."""
    B, Hs, L = x.shape
    V = w.shape[2]
    if B == 0 or Hs == 0 or V == 0:
        return y
    if L == 0:  # an empty sum
        return y.zero_()
    if _env.INTERPRET:
        _project_interpreted(x, w, y)
        return y
    block_m, block_n, block_k, warps = _blocks(B, V, x.dtype)
    native = x.dtype != torch.float32
    grid = (triton.cdiv(B, block_m), Hs, triton.cdiv(V, block_n))
    launch(_project_kernel, grid, x, bits(x), w, bits(w), y, bits(y), B, L, V,
           *x.stride(), *w.stride(), *y.stride(),
           IS_BF16=x.dtype == torch.bfloat16, NATIVE=native, WIDE=_needs_int64(x, w, y),
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
           **NO_CONTRACTION)
    return y
