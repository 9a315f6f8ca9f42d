"""Pack kernel: attention partial + LSE -> the wire buffer ``send[N, B, H/N, D+P]``.

One program per BLOCK_B tokens x BLOCK_H heads (the rows (b, h) of ``merge_math.program_rows``;
the decode tables give each head its own program). The output lanes are moved as raw bits
(an int16/int32 view), so the copy is exact for every value, NaN payloads included; the LSE is
converted to float32 and its bits written into the P trailing lanes. Empty-shard masking (rows of
requests with no local KV, and padding rows) is fused here: their LSE goes out as -inf.

Two kernels write the same bytes. ``_pack_kernel`` writes the rows (b, h) one by one: a wire
row of D + P lanes starts at no 16-byte boundary, so its stores are single lanes; its loads
from ``out`` are 16-byte vectors, or at decode sizes single lanes too (``LANE_LOADS``: the
tile then needs no shuffle between the two). ``_pack_slab_kernel`` (32-bit lanes with one LSE lane:
fp32, or 16-bit outputs moved as words) writes G consecutive heads of one (peer, token) as one
chunk of G * (W + 1) words, W the head's words; with G and H/N multiples of 4 every chunk starts
on a 16-byte boundary, so it stores 16-byte vectors. Each vector's four words come from two
aligned source vectors and the head's LSE, shuffled in registers. The launch table picks it for
large problems (docs/perf_history.md, fifth pass) and for 512-lane heads from 4k to 8k rows
(seventh).
Both kernels run on a token-major grid (programs dispatched one after another take consecutive
tokens) or a head-major one (``HEAD_MAJOR``: consecutive heads of a token, so that the programs
running at once read consecutive bytes; the table's choice for 512-lane heads above 8k rows).

The launchers here trust their input: :func:`dcp_a2a.pack_send` and :func:`dcp_a2a.lse_reduce`
check it first.
"""

from __future__ import annotations

from .. import _env  # sets TRITON_INTERPRET before the kernels are defined

import torch
import triton
import triton.language as tl

from ._host import (as_words, bits, cached_plan, needs_int64, next_pow2, prev_pow2,
                    search_steps)
from .launch import bind, launch
from .merge_math import program_rows, row_is_empty
from .tuning import pack_launch


@triton.jit
def _copy_tile(out_bits_ptr, dst_row, src_row, d0, D, row_ok, s_od,
               BLOCK_D: tl.constexpr, STREAM: tl.constexpr, LANE_LOADS: tl.constexpr):
    d = d0 + tl.arange(0, BLOCK_D)
    m = row_ok[:, None] & (d < D)[None, :]
    src = src_row[:, None] + d[None, :] * s_od
    if LANE_LOADS:
        # Claim no alignment beyond one lane: the loads are then one lane a thread, in the
        # layout of the (never 16-byte aligned) wire stores. Vector loads need the tile moved
        # between the two layouts through shared memory and a CTA barrier, on the critical
        # path of a launch that only waits on memory.
        src = tl.multiple_of(src, [1, 1])
    if STREAM:
        x = tl.load(out_bits_ptr + src, mask=m, eviction_policy="evict_first")
        tl.store(dst_row[:, None] + d[None, :], x, mask=m, cache_modifier=".cs")
    else:
        x = tl.load(out_bits_ptr + src, mask=m)
        tl.store(dst_row[:, None] + d[None, :], x, mask=m)


@triton.jit
def write_rows(
    out_bits_ptr, lse_ptr, dst_row, seq_lens_ptr, qsl_ptr, b, h, row_ok,
    D, num_seqs, steps, s_ob, s_oh, s_od, s_lb, s_lh,
    P: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_D: tl.constexpr, STREAM: tl.constexpr,
    ONE_TILE: tl.constexpr, LANE_LOADS: tl.constexpr,
):
    """Write the wire rows of tokens ``b`` and heads ``h`` (a row each; rows where ``row_ok``
    is false are skipped): ``dst_row[i]`` points at the first lane of row i on the
    wire (D output lanes, then P LSE lanes). ``ONE_TILE``: the head fits in one BLOCK_D tile
    (decode shapes), so no loop over it. ``LANE_LOADS``: see ``_copy_tile``."""
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
        _copy_tile(out_bits_ptr, dst_row, src_row, 0, D, row_ok, s_od, BLOCK_D, STREAM,
                   LANE_LOADS)
    else:
        for d0 in range(0, D, BLOCK_D):
            _copy_tile(out_bits_ptr, dst_row, src_row, d0, D, row_ok, s_od, BLOCK_D, STREAM,
                       LANE_LOADS)
    if P == 1:
        tl.store(dst_row + D, lse_bits, mask=row_ok)
    else:
        # little-endian halves: the 4 bytes of the float32 in memory order
        tl.store(dst_row + D, (lse_bits & 0xFFFF).to(tl.int16), mask=row_ok)
        tl.store(dst_row + D + 1, (lse_bits >> 16).to(tl.int16), mask=row_ok)


@triton.jit
def _pack_kernel(
    out_bits_ptr, lse_ptr, send_bits_ptr, seq_lens_ptr, qsl_ptr,
    B, H, HPR: tl.constexpr, D, num_seqs, steps,
    s_ob, s_oh, s_od, s_lb, s_lh,
    P: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, STREAM: tl.constexpr,
    ONE_TILE: tl.constexpr, WIDE: tl.constexpr, LANE_LOADS: tl.constexpr,
    HEAD_MAJOR: tl.constexpr,
):
    """This program's rows (b, h) to send[h // HPR, b, h % HPR, :]. ``WIDE``: some offset may
    pass 2^31 elements, so index in int64 (else int32, fewer instructions at decode sizes).
    ``HPR`` (heads a peer) is a constexpr: dividing by it is then a multiply and a shift; a
    run-time divisor took some twenty dependent instructions per head lane, between a decode
    launch's loads and its stores (one compile per H/N, which an engine fixes)."""
    b, h, ok = program_rows(B, H, BLOCK_B, BLOCK_H, WIDE, HEAD_MAJOR)
    row = (((h // HPR) * B + b) * HPR + h % HPR) * (D + P)
    write_rows(out_bits_ptr, lse_ptr, send_bits_ptr + row, seq_lens_ptr, qsl_ptr, b, h, ok,
               D, num_seqs, steps, s_ob, s_oh, s_od, s_lb, s_lh,
               P, HAS_MASK, BLOCK_D, STREAM, ONE_TILE, LANE_LOADS)


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


# --- the slab kernel: 16-byte stores of whole G-head chunks -------------------------------------
#
# A chunk (peer r, token b, heads j0 .. j0+G-1 of that peer) is G * (W + 1) consecutive wire
# words: head k's W data words, then its LSE word, for k = 0 .. G-1. It is written as vectors of
# 4 words; vector v holds chunk words w = 4v .. 4v+3. The source words of the G heads, row after
# row (each row W words, W % 4 == 0), form the "stream": data word d of head k is stream word
# k*W + d, and chunk word w of head k = w // (W+1) is stream word w - k. A vector spans at most
# two heads (W + 1 > 4), so its data words are 4 consecutive stream words from F = 4v - k0
# (k0: the head of its first word), less the one LSE word it may hold: they lie in the two
# aligned stream vectors F // 4 and F // 4 + 1.


@triton.jit
def _lanes_of4(x, VT: tl.constexpr):
    """[VT, 4] -> its four columns, each [VT] (a thread holds a row, so no data moves)."""
    even, odd = tl.split(tl.reshape(x, (VT, 2, 2)))  # columns (0, 2) and (1, 3)
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _word(j, x0, x1, x2, x3, y0, y1, y2):
    """Word j (0..6) of x0..x3, y0..y2 (per element; a vector's data words start at most 3
    words into X, so Y's last word is never one of them)."""
    r = tl.where(j == 1, x1, x0)
    r = tl.where(j == 2, x2, r)
    r = tl.where(j == 3, x3, r)
    r = tl.where(j == 4, y0, r)
    r = tl.where(j == 5, y1, r)
    return tl.where(j == 6, y2, r)


@triton.jit
def _chunk_lane(i: tl.constexpr, d0, s, lse_bits, x0, x1, x2, x3, y0, y1, y2,
                W: tl.constexpr):
    """Word i of each vector: its head's LSE where it is the LSE lane (d == W), else the data
    word at offset s + i in X|Y, one less past the LSE lane (the next head's row)."""
    d = d0 + i
    j = s + i - (d > W).to(tl.int32)
    return tl.where(d == W, lse_bits, _word(j, x0, x1, x2, x3, y0, y1, y2))


@triton.jit
def _chunk_vectors(src, lse_row, s_oh4, s_lh, empty, v0, NV,
                   G: tl.constexpr, W: tl.constexpr, VT: tl.constexpr, HAS_MASK: tl.constexpr):
    """Chunk vectors v0 .. v0+VT-1 (those below NV): their words [VT, 4] and their indices."""
    v = v0 + tl.arange(0, VT)
    ok = v < NV
    k0 = (4 * v) // (W + 1)        # the head of each vector's first word
    d0 = 4 * v - k0 * (W + 1)      # ... and that word's lane in the head's row
    F = 4 * v - k0                 # its stream word (were it data)
    qx = F // 4
    s = F - 4 * qx
    QPH: tl.constexpr = W // 4     # stream vectors a head
    qy = qx + 1
    # offsets as 4 x (stream vector's offset in vectors): the compiler then knows each is
    # 16-byte aligned; and integer offsets first, one pointer add each (fewer 64-bit address
    # registers: 77 -> 70 a thread at 8 vectors a thread, 17 % faster at B=8192 H=64 N=4)
    ox = 4 * ((qx // QPH) * s_oh4 + qx % QPH)
    oy = 4 * ((qy // QPH) * s_oh4 + qy % QPH)
    i = tl.arange(0, 4)[None, :]
    x = tl.load(src + (ox[:, None] + i), mask=(ok & (qx < G * QPH))[:, None])
    y = tl.load(src + (oy[:, None] + i), mask=(ok & (qy < G * QPH))[:, None])
    lse = tl.load(lse_row + k0 * s_lh, mask=ok & (d0 + 3 >= W)).to(tl.float32)
    if HAS_MASK:
        lse = tl.where(empty, float("-inf"), lse)
    lse_bits = lse.to(tl.int32, bitcast=True)
    x0, x1, x2, x3 = _lanes_of4(x, VT)
    y0, y1, y2, _ = _lanes_of4(y, VT)
    w0 = _chunk_lane(0, d0, s, lse_bits, x0, x1, x2, x3, y0, y1, y2, W)
    w1 = _chunk_lane(1, d0, s, lse_bits, x0, x1, x2, x3, y0, y1, y2, W)
    w2 = _chunk_lane(2, d0, s, lse_bits, x0, x1, x2, x3, y0, y1, y2, W)
    w3 = _chunk_lane(3, d0, s, lse_bits, x0, x1, x2, x3, y0, y1, y2, W)
    words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (VT, 4))
    return words, v, ok


@triton.jit
def _pack_slab_kernel(
    out_words_ptr, lse_ptr, send_words_ptr, seq_lens_ptr, qsl_ptr,
    B, HPR4, num_seqs, steps, s_ob4, s_oh4, s_lb, s_lh,
    G: tl.constexpr, W: tl.constexpr, VT: tl.constexpr, TT: tl.constexpr,
    HAS_MASK: tl.constexpr, WIDE: tl.constexpr, HEAD_MAJOR: tl.constexpr,
):
    """Program (b, g): token b, heads g*G .. g*G+G-1 (one peer's, G % 4 == 0), the chunk of
    G * (W + 1) words at send[r, b, j0:j0+G, :] as 16-byte vectors, in two tiles (VT and TT
    vectors; a chunk's vector count has the odd factor W + 1). ``s_ob4``, ``s_oh4``: out's
    token and head strides in 4-word vectors (its lane stride is 1)."""
    b = tl.program_id(1 if HEAD_MAJOR else 0)
    h0 = tl.program_id(0 if HEAD_MAJOR else 1) * G
    if WIDE:
        b = b.to(tl.int64)
        h0 = h0.to(tl.int64)
    r = h0 // (4 * HPR4)
    j4 = (h0 - r * 4 * HPR4) // 4
    # written as 4 * (...) so that the compiler sees the chunk start is a multiple of 4 words
    chunk = send_words_ptr + 4 * (((r * B + b) * HPR4 + j4) * (W + 1))
    src = out_words_ptr + 4 * (b * s_ob4 + h0 * s_oh4)
    lse_row = lse_ptr + b * s_lb + h0 * s_lh
    empty = False
    if HAS_MASK:
        empty = row_is_empty(b, seq_lens_ptr, qsl_ptr, num_seqs, steps)
    NV = G * (W + 1) // 4
    # every load of both tiles before the first store (a store may alias a later load)
    main, vm, okm = _chunk_vectors(src, lse_row, s_oh4, s_lh, empty, 0, NV,
                                   G, W, VT, HAS_MASK)
    tail, vt, okt = _chunk_vectors(src, lse_row, s_oh4, s_lh, empty, VT, NV,
                                   G, W, TT, HAS_MASK)
    i = tl.arange(0, 4)[None, :]
    tl.store(chunk + 4 * vm[:, None] + i, main, mask=okm[:, None])
    tl.store(chunk + 4 * vt[:, None] + i, tail, mask=okt[:, None])


def mask_args(seq_lens, query_start_loc, like: torch.Tensor):
    if seq_lens is None:
        # HAS_MASK=False: the pointers are never read, so pass a tensor we already have (a
        # fresh placeholder was a fill kernel per call: half the time of a decode-size pack).
        # The pointer's type is part of the compiled specialisation: callers pass the lanes
        # they move, so float16 and bfloat16 (both int32 words) share one compiled kernel.
        return like, like, 0, 0, False
    n = seq_lens.numel()
    # the kernels read entry i at the tensor's address + i: a view with strides (a rank's
    # column of a [requests, N] table of local KV lengths) is read through a contiguous copy
    return (seq_lens.contiguous(), query_start_loc.contiguous(), n, search_steps(n), True)


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


def slab_fits(src: torch.Tensor, lanes: int, lanes_p: int, h_per_rank: int) -> bool:
    """Whether the slab kernel can write this problem: 32-bit lanes with the LSE in one of
    them; 4 | lanes a head and 4 | heads a peer (so that every chunk of 4k heads starts on a
    16-byte boundary of the wire); head rows that are runs of 16-byte vectors (unit lane
    stride, token and head strides multiples of 4 lanes)."""
    if src.element_size() != 4 or lanes_p != 1 or lanes % 4 or h_per_rank % 4:
        return False
    s_b, s_h, s_d = src.stride()
    return s_d == 1 and s_b % 4 == 0 and s_h % 4 == 0


# The grid and constexpr keywords of each launch, built once per problem rather than on every
# call (host time per eager call); see ``_host.cached_plan``.
_PLANS: dict = {}


def _row_plan(cfg, B, H, lanes, lanes_p, has_mask, wide):
    return cfg.grid(B, H), dict(
        P=lanes_p, HAS_MASK=has_mask, BLOCK_B=cfg.block_b, BLOCK_H=cfg.block_h,
        BLOCK_D=cfg.block_d, STREAM=cfg.stream, ONE_TILE=cfg.block_d >= lanes, WIDE=wide,
        LANE_LOADS=cfg.lane_loads, HEAD_MAJOR=cfg.head_major, num_warps=cfg.num_warps)


def _slab_plan(cfg, B, H, words, has_mask, wide):
    g = cfg.block_h
    vectors = g * (words + 1) // 4
    main = prev_pow2(g * words // 4)  # the chunk's vectors: a power-of-two tile and the rest
    return cfg.grid(B, H), dict(
        G=g, W=words, VT=main, TT=next_pow2(vectors - main), HAS_MASK=has_mask, WIDE=wide,
        HEAD_MAJOR=cfg.head_major, num_warps=cfg.num_warps)


def pack(out, lse, send, h_per_rank, seq_lens=None, query_start_loc=None, with_site=False):
    """Write ``send[N, B, H/N, D+P]`` (contiguous, out's dtype) from ``out[B, H, D]`` and
    ``lse[B, H]``; rows that ``seq_lens``/``query_start_loc`` mark empty go out with LSE -inf.
    ``with_site``: return the launch's :class:`~dcp_a2a.kernels.launch.Site` (None: nothing
    launched, or no direct launches here), for a caller that repeats the problem; its
    addresses are those of out, lse, send and the two index tensors (out's where there are
    none; no Site where an index tensor with strides was read through a copy)."""
    B, H, D = out.shape
    if B == 0 or H == 0:
        return None
    src, lanes, lanes_p, paired = lanes_of(out, send.shape[-1] - D)
    sl, qsl, num_seqs, steps, has_mask = mask_args(seq_lens, query_start_loc, src)
    if has_mask and (sl is not seq_lens or qsl is not query_start_loc):
        with_site = False  # a Site relaunches with the caller's index addresses, not the copies
    dst = send.view(torch.int32) if paired else bits(send)
    cfg = pack_launch(B, H, lanes, H // h_per_rank, slab_fits(src, lanes, lanes_p, h_per_rank))
    wide = needs_int64(src, lse, dst)
    if cfg.slab:
        return _launch_slab(src, lse, dst, sl, qsl, num_seqs, steps, has_mask, h_per_rank,
                            lanes, cfg, wide, how=bind if with_site else launch)
    grid, kw = cached_plan(_PLANS, cfg, ("row", B, H, h_per_rank, lanes, lanes_p, has_mask, wide),
                           lambda: _row_plan(cfg, B, H, lanes, lanes_p, has_mask, wide))
    site = (bind if with_site else launch)(
        _pack_kernel, grid, src, lse, dst, sl, qsl, B, H, h_per_rank, lanes, num_seqs, steps,
        *src.stride(), *lse.stride(), **kw)
    return site if with_site else None


def _launch_slab(src, lse, dst, sl, qsl, num_seqs, steps, has_mask, hpr, words, cfg, wide,
                 how=launch):
    B, H = lse.shape
    grid, kw = cached_plan(_PLANS, cfg, ("slab", B, H, hpr, words, has_mask, wide),
                           lambda: _slab_plan(cfg, B, H, words, has_mask, wide))
    s_ob, s_oh, _ = src.stride()
    site = how(_pack_slab_kernel, grid, src, lse, dst, sl, qsl, B, hpr // 4, num_seqs, steps,
               s_ob // 4, s_oh // 4, *lse.stride(), **kw)
    return site if how is bind else None


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
    launch(
        _lse_to_wire_kernel, (triton.cdiv(B, block_b), triton.cdiv(H, block_h)),
        lse, dst, sl, qsl, B, H, hpr, num_seqs, steps,
        lse.stride(0), lse.stride(1), s_dr, s_db, s_dj,
        HAS_MASK=has_mask, BLOCK_B=block_b, BLOCK_H=block_h,
    )
