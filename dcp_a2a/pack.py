"""Pack kernel: attention partial + LSE -> the wire buffer ``send[N, B, H/N, D+P]``.

One program per (token row b, block of BLOCK_H heads). The output lanes are moved as raw bits
(an int16/int32 view), so the copy is exact for every value, NaN payloads included; the LSE is
converted to float32 and its bits written into the P trailing lanes. Empty-shard masking (rows of
requests with no local KV, and padding rows) is fused here: their LSE goes out as -inf.
"""

from __future__ import annotations

from . import _env  # noqa: F401

import torch
import triton
import triton.language as tl

from ._launch import (
    as_words as _as_words,
    bits,
    next_pow2,
    require_disjoint,
    require_runnable_device,
    search_steps,
)
from .merge_math import row_is_empty
from .tuning import pack_launch
from .wire import (
    check_head_split,
    check_output_and_lse,
    check_seq_meta,
    check_wire_buffer,
    lse_pack_dim as _lse_pack_dim,
    require_int,
    require_same_device,
    wire_shape,
)


@triton.jit
def _pack_kernel(
    out_bits_ptr, lse_ptr, send_bits_ptr, seq_lens_ptr, qsl_ptr,
    B, H, HPR, D, num_seqs, steps,
    s_ob, s_oh, s_od, s_lb, s_lh,
    P: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, STREAM: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < H
    peer = h // HPR
    row = ((peer * B + b) * HPR + h % HPR) * (D + P)  # int64: the buffer may pass 2^31 elements

    src_row = b * s_ob + h * s_oh
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        m = h_ok[:, None] & (d < D)[None, :]
        if STREAM:
            x = tl.load(out_bits_ptr + src_row[:, None] + d[None, :] * s_od, mask=m,
                        eviction_policy="evict_first")
            tl.store(send_bits_ptr + row[:, None] + d[None, :], x, mask=m, cache_modifier=".cs")
        else:
            x = tl.load(out_bits_ptr + src_row[:, None] + d[None, :] * s_od, mask=m)
            tl.store(send_bits_ptr + row[:, None] + d[None, :], x, mask=m)

    lse = tl.load(lse_ptr + b * s_lb + h * s_lh, mask=h_ok).to(tl.float32)
    if HAS_MASK:
        empty = row_is_empty(b, seq_lens_ptr, qsl_ptr, num_seqs, steps)
        lse = tl.where(empty, float("-inf"), lse)
    lse_bits = lse.to(tl.int32, bitcast=True)
    if P == 1:
        tl.store(send_bits_ptr + row + D, lse_bits, mask=h_ok)
    else:
        # little-endian halves: the 4 bytes of the float32 in memory order
        tl.store(send_bits_ptr + row + D, (lse_bits & 0xFFFF).to(tl.int16), mask=h_ok)
        tl.store(send_bits_ptr + row + D + 1, (lse_bits >> 16).to(tl.int16), mask=h_ok)


@triton.jit
def _lse_to_wire_kernel(
    lse_ptr, dst_ptr, seq_lens_ptr, qsl_ptr,
    H, HPR, num_seqs, steps,
    s_lb, s_lh, s_dr, s_db, s_dj,
    HAS_MASK: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """fp32 masked LSE into dst[r, b, j] (any strides): the LSE half of the two-collective and
    AG+RS paths, with the same masking as the pack kernel."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < H
    lse = tl.load(lse_ptr + b * s_lb + h * s_lh, mask=h_ok).to(tl.float32)
    if HAS_MASK:
        empty = row_is_empty(b, seq_lens_ptr, qsl_ptr, num_seqs, steps)
        lse = tl.where(empty, float("-inf"), lse)
    tl.store(dst_ptr + (h // HPR) * s_dr + b * s_db + (h % HPR) * s_dj, lse, mask=h_ok)


def _mask_args(seq_lens, query_start_loc, like: torch.Tensor):
    if seq_lens is None:
        dummy = like.new_zeros(1, dtype=torch.int32)
        return dummy, dummy, 0, 0, False
    n = seq_lens.numel()
    return seq_lens, query_start_loc, n, search_steps(n), True


def pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None) -> None:
    """Write ``send[N, B, H/N, D+P]`` from ``out[B, H, D]`` and ``lse[B, H]`` (see
    :mod:`dcp_a2a.wire`). ``out`` in fp16/bf16/fp32, any strides; ``lse`` in fp32/bf16/fp16.

    ``seq_lens[num_seqs]`` (this rank's local KV length per request) and
    ``query_start_loc[num_seqs + 1]`` (cumulative query rows) mask empty and padding rows:
    their LSE is sent as -inf. Raises ValueError for any inconsistent argument.
    """
    B, H, D = check_output_and_lse(out, lse)
    require_int("world_size", world_size, 1)
    hpr = check_head_split(H, world_size)
    require_int("h_per_rank", h_per_rank, 1 if H else 0)
    if h_per_rank != hpr:
        raise ValueError(f"h_per_rank={h_per_rank} but H/N = {H}/{world_size} = {hpr}")
    require_int("head_dim", head_dim, 1)
    if head_dim != D:
        raise ValueError(f"head_dim={head_dim} does not match out's last dim {D}")
    p = _lse_pack_dim(out.dtype)
    if lse_pack_dim != p:
        raise ValueError(f"lse_pack_dim={lse_pack_dim} does not match {out.dtype} (expected {p})")
    check_wire_buffer("send", send, head_dim=D, lse_pack_dim_=p, dtype=out.dtype,
                      expected_shape=wire_shape(world_size, B, hpr, D, out.dtype))
    require_same_device(out=out, lse=lse, send=send)
    check_seq_meta(seq_lens, query_start_loc, B, out.device)
    require_disjoint("send", send, out=out, lse=lse)
    if B == 0 or H == 0:
        return
    require_runnable_device(out)
    sl, qsl, num_seqs, steps, has_mask = _mask_args(seq_lens, query_start_loc, out)
    src, dst, lanes, lanes_p = bits(out), bits(send), D, p
    if p == 2 and D % 2 == 0:
        words = _as_words(out)
        if words is not None:
            # two 16-bit lanes per 32-bit access; the fp32 LSE is then exactly one word
            src, dst, lanes, lanes_p = words, send.view(torch.int32), D // 2, 1
    cfg = pack_launch(B, H, lanes)
    grid = (B, triton.cdiv(H, cfg.block_h))
    _pack_kernel[grid](
        src, lse, dst, sl, qsl,
        B, H, hpr, lanes, num_seqs, steps,
        src.stride(0), src.stride(1), src.stride(2), lse.stride(0), lse.stride(1),
        P=lanes_p, HAS_MASK=has_mask, BLOCK_H=cfg.block_h, BLOCK_D=cfg.block_d,
        STREAM=cfg.stream, num_warps=cfg.num_warps,
    )


def lse_to_wire(lse, dst, world_size, seq_lens=None, query_start_loc=None) -> None:
    """Masked fp32 LSE ``lse[B, H]`` -> ``dst`` viewed as [N, B, H/N] through its strides
    (``dst`` is either [N, B, H/N] or [B, H])."""
    B, H = lse.shape
    hpr = H // world_size
    if dst.dim() == 2:  # [B, H] == [B, N, H/N]
        s_dr, s_db, s_dj = hpr * dst.stride(1), dst.stride(0), dst.stride(1)
    else:
        s_dr, s_db, s_dj = dst.stride(0), dst.stride(1), dst.stride(2)
    if B == 0 or H == 0:
        return
    require_runnable_device(lse)
    sl, qsl, num_seqs, steps, has_mask = _mask_args(seq_lens, query_start_loc, lse)
    block_h = min(next_pow2(H), 1024)
    _lse_to_wire_kernel[(B, triton.cdiv(H, block_h))](
        lse, dst, sl, qsl, H, hpr, num_seqs, steps,
        lse.stride(0), lse.stride(1), s_dr, s_db, s_dj,
        HAS_MASK=has_mask, BLOCK_H=block_h,
    )
