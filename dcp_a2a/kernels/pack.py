"""Pack kernel: attention partial + LSE -> the wire buffer ``send[N, B, H/N, D+P]``.

One program per BLOCK_B tokens x BLOCK_H heads (the rows (b, h) of ``merge_math.program_rows``;
the decode tables give each head its own program). The output lanes are moved as raw bits
(an int16/int32 view), so the copy is exact for every value, NaN payloads included; the LSE is
converted to float32 and its bits written into the P trailing lanes. Empty-shard masking (rows of
requests with no local KV, and padding rows) is fused here: their LSE goes out as -inf.

The launchers here trust their input: :func:`dcp_a2a.pack_send` and :func:`dcp_a2a.lse_reduce`
check it first.
"""

from __future__ import annotations

from .. import _env  # sets TRITON_INTERPRET before the kernels are defined

import torch
import triton
import triton.language as tl

from ._host import as_words, bits, needs_int64, next_pow2, search_steps
from .merge_math import program_rows, row_is_empty
from .tuning import pack_launch


@triton.jit
def _copy_tile(out_bits_ptr, dst_row, src_row, d0, D, row_ok, s_od,
               BLOCK_D: tl.constexpr, STREAM: tl.constexpr):
    d = d0 + tl.arange(0, BLOCK_D)
    m = row_ok[:, None] & (d < D)[None, :]
    if STREAM:
        x = tl.load(out_bits_ptr + src_row[:, None] + d[None, :] * s_od, mask=m,
                    eviction_policy="evict_first")
        tl.store(dst_row[:, None] + d[None, :], x, mask=m, cache_modifier=".cs")
    else:
        x = tl.load(out_bits_ptr + src_row[:, None] + d[None, :] * s_od, mask=m)
        tl.store(dst_row[:, None] + d[None, :], x, mask=m)


@triton.jit
def write_rows(
    out_bits_ptr, lse_ptr, dst_row, seq_lens_ptr, qsl_ptr, b, h, row_ok,
    D, num_seqs, steps, s_ob, s_oh, s_od, s_lb, s_lh,
    P: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_D: tl.constexpr, STREAM: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    """Write the wire rows of tokens ``b`` and heads ``h`` (a row each; rows where ``row_ok``
    is false are skipped): ``dst_row[i]`` points at the first lane of row i on the
    wire (D output lanes, then P LSE lanes). ``ONE_TILE``: the head fits in one BLOCK_D tile
    (decode shapes), so no loop over it."""
    # The LSE is loaded before any store: the compiler cannot move a load above a store that
    # may alias it, and loaded after the copy it was a second memory round trip in series
    # with the first (the whole time of a decode-size launch is about two such trips).
    lse = tl.load(lse_ptr + b * s_lb + h * s_lh, mask=row_ok).to(tl.float32)
    if HAS_MASK:
        empty = row_is_empty(b, seq_lens_ptr, qsl_ptr, num_seqs, steps)
        lse = tl.where(empty, float("-inf"), lse)
    lse_bits = lse.to(tl.int32, bitcast=True)

    src_row = b * s_ob + h * s_oh
    if ONE_TILE:
        _copy_tile(out_bits_ptr, dst_row, src_row, 0, D, row_ok, s_od, BLOCK_D, STREAM)
    else:
        for d0 in range(0, D, BLOCK_D):
            _copy_tile(out_bits_ptr, dst_row, src_row, d0, D, row_ok, s_od, BLOCK_D, STREAM)
    if P == 1:
        tl.store(dst_row + D, lse_bits, mask=row_ok)
    else:
        # little-endian halves: the 4 bytes of the float32 in memory order
        tl.store(dst_row + D, (lse_bits & 0xFFFF).to(tl.int16), mask=row_ok)
        tl.store(dst_row + D + 1, (lse_bits >> 16).to(tl.int16), mask=row_ok)


@triton.jit
def _pack_kernel(
    out_bits_ptr, lse_ptr, send_bits_ptr, seq_lens_ptr, qsl_ptr,
    B, H, HPR, D, num_seqs, steps,
    s_ob, s_oh, s_od, s_lb, s_lh,
    P: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, STREAM: tl.constexpr,
    ONE_TILE: tl.constexpr, WIDE: tl.constexpr,
):
    """This program's rows (b, h) to send[h // HPR, b, h % HPR, :]. ``WIDE``: some offset may
    pass 2^31 elements, so index in int64 (else int32, fewer instructions at decode sizes)."""
    b, h, ok = program_rows(B, H, BLOCK_B, BLOCK_H, WIDE)
    row = (((h // HPR) * B + b) * HPR + h % HPR) * (D + P)
    write_rows(out_bits_ptr, lse_ptr, send_bits_ptr + row, seq_lens_ptr, qsl_ptr, b, h, ok,
               D, num_seqs, steps, s_ob, s_oh, s_od, s_lb, s_lh,
               P, HAS_MASK, BLOCK_D, STREAM, ONE_TILE)


@triton.jit
def _lse_to_wire_kernel(
    lse_ptr, dst_ptr, seq_lens_ptr, qsl_ptr,
    B, H, HPR, num_seqs, steps,
    s_lb, s_lh, s_dr, s_db, s_dj,
    HAS_MASK: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """fp32 masked LSE into dst[r, b, j] (any strides): the LSE half of the two-collective and
    AG+RS paths, with the same masking as the pack kernel."""
    b, h, ok = program_rows(B, H, BLOCK_B, BLOCK_H, True)
    lse = tl.load(lse_ptr + b * s_lb + h * s_lh, mask=ok).to(tl.float32)
    if HAS_MASK:
        empty = row_is_empty(b, seq_lens_ptr, qsl_ptr, num_seqs, steps)
        lse = tl.where(empty, float("-inf"), lse)
    tl.store(dst_ptr + (h // HPR) * s_dr + b * s_db + (h % HPR) * s_dj, lse, mask=ok)


def mask_args(seq_lens, query_start_loc, like: torch.Tensor):
    if seq_lens is None:
        # HAS_MASK=False: the pointers are never read, so pass a tensor we already have (a
        # fresh placeholder was a fill kernel per call: half the time of a decode-size pack)
        return like, like, 0, 0, False
    n = seq_lens.numel()
    return seq_lens, query_start_loc, n, search_steps(n), True


def lanes_of(out: torch.Tensor, lse_lanes: int):
    """How the kernels move ``out``'s bits: (source view, lanes per head, LSE lanes, paired).

    Paired: a 16-bit output with even D and word-aligned strides moves as 32-bit words (two
    lanes per access) and its fp32 LSE is exactly one word; the wire buffer is then viewed as
    int32 too. Otherwise one lane per element, in the integer type of the element's width."""
    D = out.shape[-1]
    if lse_lanes == 2 and D % 2 == 0:
        words = as_words(out)
        if words is not None:
            return words, D // 2, 1, True
    return bits(out), D, lse_lanes, False


def pack(out, lse, send, h_per_rank, seq_lens=None, query_start_loc=None) -> None:
    """Write ``send[N, B, H/N, D+P]`` (contiguous, out's dtype) from ``out[B, H, D]`` and
    ``lse[B, H]``; rows that ``seq_lens``/``query_start_loc`` mark empty go out with LSE -inf."""
    B, H, D = out.shape
    if B == 0 or H == 0:
        return
    sl, qsl, num_seqs, steps, has_mask = mask_args(seq_lens, query_start_loc, out)
    src, lanes, lanes_p, paired = lanes_of(out, send.shape[-1] - D)
    dst = send.view(torch.int32) if paired else bits(send)
    cfg = pack_launch(B, H, lanes, H // h_per_rank)
    _pack_kernel[cfg.grid(B, H)](
        src, lse, dst, sl, qsl,
        B, H, h_per_rank, lanes, num_seqs, steps,
        src.stride(0), src.stride(1), src.stride(2), lse.stride(0), lse.stride(1),
        P=lanes_p, HAS_MASK=has_mask, BLOCK_B=cfg.block_b, BLOCK_H=cfg.block_h,
        BLOCK_D=cfg.block_d,
        STREAM=cfg.stream, ONE_TILE=cfg.block_d >= lanes, WIDE=needs_int64(src, lse, dst),
        num_warps=cfg.num_warps,
    )


def lse_to_wire(lse, dst, world_size, seq_lens=None, query_start_loc=None) -> None:
    """Masked fp32 LSE ``lse[B, H]`` -> ``dst`` viewed as [N, B, H/N] through its strides
    (``dst`` is either [N, B, H/N] or [B, H])."""
    B, H = lse.shape
    if B == 0 or H == 0:
        return
    hpr = H // world_size
    if dst.dim() == 2:  # [B, H] == [B, N, H/N]
        s_dr, s_db, s_dj = hpr * dst.stride(1), dst.stride(0), dst.stride(1)
    else:
        s_dr, s_db, s_dj = dst.stride(0), dst.stride(1), dst.stride(2)
    sl, qsl, num_seqs, steps, has_mask = mask_args(seq_lens, query_start_loc, lse)
    block_h = min(next_pow2(H), 1024)
    block_b = min(next_pow2(B), 1024 // block_h) if _env.INTERPRET else 1
    _lse_to_wire_kernel[(triton.cdiv(B, block_b), triton.cdiv(H, block_h))](
        lse, dst, sl, qsl, B, H, hpr, num_seqs, steps,
        lse.stride(0), lse.stride(1), s_dr, s_db, s_dj,
        HAS_MASK=has_mask, BLOCK_B=block_b, BLOCK_H=block_h,
    )
