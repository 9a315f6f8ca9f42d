"""Combine kernels: merge the N received attention states of this rank's heads.

``combine_packed`` reads the packed wire buffer ``recv[N, B, H/N, D+P]``; ``combine_separate``
reads the two-collective layout (``data[N, B, H/N, D]`` + fp32 ``lse[N, B, H/N]``). Both launch
the same kernel, which differs only in where it loads the LSE from, and its arithmetic is the
same sequence of roundings under every launch configuration (see merge_math), so their results
are bitwise identical. ``scale_for_reduce_scatter`` is the AG+RS path's local step: it weights
this rank's partial by exp(s_local - g) through the same ``merge_weights``.

The launchers here trust their input: :func:`dcp_a2a.unpack_combine` and
:func:`dcp_a2a.lse_reduce` check it first.
"""

from __future__ import annotations

import functools

from .. import _env  # (sets TRITON_INTERPRET before the kernels are defined)

import torch
import triton
import triton.language as tl

from ._host import as_words, bits, cached_plan, needs_int64
from .launch import bind, launch
from .tuning import combine_launch, scale_launch
from .merge_math import (
    NO_CONTRACTION,
    add_weighted,
    join_pair_from_f32,
    load_f32,
    merge_weights,
    program_rows,
    split_pair_f32,
    store_from_f32,
    weighted_term,
)


@triton.jit
def _load_lses(data_bits_ptr, lse_ptr, b, h, row_ok,
               s_dn, s_db, s_dh, s_ln, s_lb, s_lh, D,
               N: tl.constexpr, LSE_LANES: tl.constexpr):
    """The fp32 LSEs of the rows (b, h) from each of the N ranks: a tuple of N [rows]
    vectors, -inf where the row does not exist."""
    lses = ()
    for r in tl.static_range(N):
        if LSE_LANES == 0:
            lse = tl.load(lse_ptr + r * s_ln + b * s_lb + h * s_lh, mask=row_ok,
                          other=float("-inf"))
        else:
            lane = data_bits_ptr + r * s_dn + b * s_db + h * s_dh + D
            if LSE_LANES == 1:
                lse_bits = tl.load(lane, mask=row_ok, other=0)
            else:
                lo = tl.load(lane, mask=row_ok, other=0).to(tl.int32) & 0xFFFF
                hi = tl.load(lane + 1, mask=row_ok, other=0).to(tl.int32)
                lse_bits = (hi << 16) | lo
            lse = tl.where(row_ok, lse_bits.to(tl.float32, bitcast=True), float("-inf"))
        lses = lses + (lse,)
    return lses


@triton.jit
def _load_ranks(data_ptr, data_bits_ptr, src_row, d, md, s_dn, s_dd,
                N: tl.constexpr, IS_BF16: tl.constexpr, PAIRS: tl.constexpr,
                STREAM: tl.constexpr):
    """The [rows, BLOCK_D] tiles of lanes ``d`` of all N ranks, as a tuple indexed by rank:
    32-bit words where PAIRS (two 16-bit values each), else fp32 values. All N loads are
    issued here, before any arithmetic that waits on them."""
    tiles = ()
    for r in tl.static_range(N):
        offs = r * s_dn + src_row[:, None] + d[None, :] * s_dd
        if PAIRS:
            if STREAM:
                w = tl.load(data_bits_ptr + offs, mask=md, other=0,
                            eviction_policy="evict_first")
            else:
                w = tl.load(data_bits_ptr + offs, mask=md, other=0)
        else:
            w = load_f32(data_ptr, data_bits_ptr, offs, md, IS_BF16)
        tiles = tiles + (w,)
    return tiles


@triton.jit
def _merge_ranks(tiles, out_ptr, out_bits_ptr, scales, out_row, d, md, s_od,
                 N: tl.constexpr, IS_BF16: tl.constexpr, PAIRS: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_D: tl.constexpr, NATIVE_BF16: tl.constexpr):
    """Store sum_r scale_r * tiles[r], added in rank order 0..N-1 (the order merge_weights
    sums the weights in). (A branch a rank on a one-row program's weight, instead of the
    select a lane in add_weighted, was 2-23 % slower, median 8 %, at the 17 decode rows on
    an H100: docs/perf_history.md, sixteenth pass.)"""
    acc = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)
    acc_hi = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)  # PAIRS only
    for r in tl.static_range(N):
        sc = scales[r][:, None]
        if PAIRS:
            lo, hi = split_pair_f32(tiles[r], IS_BF16)
            acc = add_weighted(acc, sc, lo)
            acc_hi = add_weighted(acc_hi, sc, hi)
        else:
            acc = add_weighted(acc, sc, tiles[r])
    offs_out = out_row[:, None] + d[None, :] * s_od
    if PAIRS:
        w = join_pair_from_f32(acc, acc_hi, IS_BF16, NATIVE_BF16)
        tl.store(out_bits_ptr + offs_out, w, mask=md)
    else:
        store_from_f32(out_ptr, out_bits_ptr, offs_out, acc, md, IS_BF16, NATIVE_BF16)


@triton.jit
def combine_rows(
    data_ptr, data_bits_ptr, lse_ptr, out_ptr, out_bits_ptr, lse_out_ptr,
    B, HPR, D,
    s_dn, s_db, s_dh, s_dd, s_ln, s_lb, s_lh, s_ob, s_oh, s_od,
    N: tl.constexpr, LSE_LANES: tl.constexpr, BASE_E: tl.constexpr,
    RETURN_LSE: tl.constexpr, IS_BF16: tl.constexpr, PAIRS: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, STREAM: tl.constexpr, ONE_TILE: tl.constexpr, WIDE: tl.constexpr,
    NATIVE_BF16: tl.constexpr, SPLIT_D: tl.constexpr, HEAD_MAJOR: tl.constexpr,
):
    """out[b, h, :] = sum_r scale_r * data[r, b, h, :] for this program's rows (BLOCK_B tokens
    x BLOCK_H local heads, ``merge_math.program_rows``): the combine kernel (launched on the
    grid (cdiv(B, BLOCK_B), cdiv(H/N, BLOCK_H))), also called by the symm_mem combine once its
    peers' slices are in.

    PAIRS: the data (and output) pointers are 32-bit words holding two 16-bit values, D and
    the strides count words, and a packed LSE is the word at index D (LSE_LANES == 1).
    ONE_TILE: the head fits one BLOCK_D tile (no loop over it); WIDE: index in int64 (some
    offset may pass 2^31), else int32. NATIVE_BF16: round bf16 outputs with the GPU's
    conversion instruction (the same bits, see merge_math; compiled, sm_80 or newer only).
    SPLIT_D > 1 (with ONE_TILE): the grid's third axis picks the BLOCK_D tile of the head this
    program writes (each of the SPLIT_D programs of a row computes the same weights).
    HEAD_MAJOR: the grid's first two axes swapped (``Launch.grid``: programs dispatched one
    after another read one token's heads, consecutive wire rows)."""
    b, h, row_ok = program_rows(B, HPR, BLOCK_B, BLOCK_H, WIDE, HEAD_MAJOR)
    src_row = b * s_db + h * s_dh
    # the output's strides: a caller's buffer (``into=``) may have any (the merged result's
    # own is contiguous, strides (HPR*D, D, 1)); the LSE out is always contiguous
    out_row = b * s_ob + h * s_oh
    ROWS: tl.constexpr = BLOCK_B * BLOCK_H
    lses = _load_lses(data_bits_ptr, lse_ptr, b, h, row_ok,
                      s_dn, s_db, s_dh, s_ln, s_lb, s_lh, D, N, LSE_LANES)
    # The rank loops are unrolled (N is a constexpr: one compile per group size), and a tile's
    # data is loaded before the weights are computed, so the LSEs and all N data loads can be
    # in flight together. (One [BLOCK_N, BLOCK_H, BLOCK_D] tile was tried: slower at every
    # shape; docs/perf_history.md.)
    if ONE_TILE:
        d = tl.arange(0, BLOCK_D)
        if SPLIT_D > 1:
            d = d + tl.program_id(2) * BLOCK_D
        md = row_ok[:, None] & (d < D)[None, :]
        tiles = _load_ranks(data_ptr, data_bits_ptr, src_row, d, md, s_dn, s_dd,
                            N, IS_BF16, PAIRS, STREAM)
        scales, g = merge_weights(lses, N, BASE_E)
        _merge_ranks(tiles, out_ptr, out_bits_ptr, scales, out_row, d, md, s_od,
                     N, IS_BF16, PAIRS, ROWS, BLOCK_D, NATIVE_BF16)
    else:
        scales, g = merge_weights(lses, N, BASE_E)
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            md = row_ok[:, None] & (d < D)[None, :]
            tiles = _load_ranks(data_ptr, data_bits_ptr, src_row, d, md, s_dn, s_dd,
                                N, IS_BF16, PAIRS, STREAM)
            _merge_ranks(tiles, out_ptr, out_bits_ptr, scales, out_row, d, md, s_od,
                         N, IS_BF16, PAIRS, ROWS, BLOCK_D, NATIVE_BF16)
    if RETURN_LSE:
        if SPLIT_D == 1:
            tl.store(lse_out_ptr + b * HPR + h, g, mask=row_ok)
        elif tl.program_id(2) == 0:  # one program of the row writes its LSE (a branch: the
            # interpreter takes no mask of a row vector and'ed with a program id)
            tl.store(lse_out_ptr + b * HPR + h, g, mask=row_ok)


# ``rank`` only picks the LSE a row is scaled by: left unspecialised, the ranks share one
# compiled kernel where Triton would compile rank 0, rank 1 and the rest apart
@triton.jit(do_not_specialize=["rank"])
def _scale_kernel(
    out_ptr, out_bits_ptr, lse_all_ptr, dst_ptr, dst_bits_ptr, lse_out_ptr,
    B, H, HPR, D, rank,
    s_ob, s_oh, s_od,
    N: tl.constexpr, BASE_E: tl.constexpr, RETURN_LSE: tl.constexpr, IS_BF16: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """AG+RS local step: dst[h // HPR, b, h % HPR, :] = exp(s_rank - g) * out[b, h, :], for
    this program's rows (b, h)."""
    b, h, row_ok = program_rows(B, H, BLOCK_B, BLOCK_H, True)
    lses = ()
    for r in tl.static_range(N):
        lses = lses + (tl.load(lse_all_ptr + (r * B + b) * H + h, mask=row_ok,
                               other=float("-inf")),)
    scales, g = merge_weights(lses, N, BASE_E)
    sc = tl.zeros_like(g)
    for r in tl.static_range(N):  # this rank's weight (the rank is a run-time value)
        sc = tl.where(rank == r, scales[r], sc)
    sc = sc[:, None]
    dst_row = ((h // HPR) * B + b) * HPR + h % HPR
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        md = row_ok[:, None] & (d < D)[None, :]
        x = load_f32(out_ptr, out_bits_ptr, (b * s_ob + h * s_oh)[:, None] + d[None, :] * s_od,
                     md, IS_BF16)
        y = weighted_term(sc, x)
        store_from_f32(dst_ptr, dst_bits_ptr, dst_row[:, None] * D + d[None, :], y, md, IS_BF16)
    if RETURN_LSE:
        mine = row_ok & (h // HPR == rank)
        tl.store(lse_out_ptr + b * HPR + h % HPR, g, mask=mine)


# The grid and constexpr keywords of each launch, built once per problem rather than on every
# call (host time per eager call); see ``_host.cached_plan``.
_PLANS: dict = {}


# Whether the compiled combine rounds bf16 outputs with the GPU's conversion instruction
# (sm_80 and newer have it; the bits are those of the integer rounding, merge_math), and up to
# how many warps a program. Two eager-call probes on an H100 (docs/perf.md, sixteenth pass):
# with 1 or 2 warps the native rounding took 0.91-1.01 of the integer rounding's time at the
# 9 such bf16 rows of one probe, 0.91-0.98 at the 5 of the next; with 4 or 8 warps 1.02-1.08
# at the 4 such rows in both (B=16 and 32 H=128 N=8: 1.07-1.08 and 1.05; B=32 went above the
# engine design). The benchmark turns it off to time the integer rounding beside it.
USE_NATIVE_BF16 = True
NATIVE_BF16_MAX_WARPS = 2


@functools.cache
def _native_bf16_ok() -> bool:
    """Every visible GPU has the sm_80 conversion (a plan does not depend on the device)."""
    return all(torch.cuda.get_device_capability(i) >= (8, 0)
               for i in range(torch.cuda.device_count()))


def native_bf16(dtype, num_warps: int = 1) -> bool:
    """Whether a combine launch of ``num_warps`` warps rounds bf16 with the GPU's instruction
    (compiled, sm_80+, at most NATIVE_BF16_MAX_WARPS warps)."""
    return (dtype == torch.bfloat16 and USE_NATIVE_BF16 and not _env.INTERPRET
            and num_warps <= NATIVE_BF16_MAX_WARPS and _native_bf16_ok())


def _combine_plan(cfg, N, B, hpr, lanes, lse_lanes, return_lse, is_lse_base_on_e, dtype,
                  pairs, wide):
    return cfg.grid(B, hpr), dict(
        N=N, LSE_LANES=lse_lanes, BASE_E=is_lse_base_on_e, RETURN_LSE=return_lse,
        IS_BF16=dtype == torch.bfloat16, PAIRS=pairs, BLOCK_B=cfg.block_b, BLOCK_H=cfg.block_h,
        BLOCK_D=cfg.block_d, STREAM=cfg.stream, ONE_TILE=cfg.block_d * cfg.split_d >= lanes,
        WIDE=wide, NATIVE_BF16=native_bf16(dtype, cfg.num_warps), SPLIT_D=cfg.split_d,
        HEAD_MAJOR=cfg.head_major, num_warps=cfg.num_warps,
        **NO_CONTRACTION)


def combine_launch_args(data, lse, N, B, hpr, D, lse_lanes, return_lse, is_lse_base_on_e,
                        out=None):
    """(grid, positional args, constexpr keywords, out, lse_out) of one combine launch.

    ``data``: the buffer whose rows start with the D output lanes (the whole wire row when
    the LSE is packed in the ``lse_lanes`` = P lanes after them, ``lse`` then None; else
    ``lse`` is the separate fp32 LSE and ``lse_lanes`` = 0). ``out``: where the merged
    ``[B, H/N, D]`` goes (a caller's buffer, any strides, data's dtype); None: a fresh
    contiguous tensor. Lanes, strides and offsets count the units the kernel moves: 32-bit
    words when two 16-bit lanes are paired (``kw["PAIRS"]``; both data and out must then be
    viewable as words), else elements. ``lse_out`` is None unless ``return_lse``. The keywords
    are shared between calls: do not change them."""
    dtype, dev = data.dtype, data.device
    if out is None:
        out = torch.empty((B, hpr, D), dtype=dtype, device=dev)
    words = as_words(data) if D % 2 == 0 else None
    out_words = as_words(out) if words is not None else None
    if out_words is not None:  # two 16-bit lanes per 32-bit access; the LSE is one word
        src = src_bits = words
        out_bits, lanes = out_words, D // 2
        lse_lanes = min(lse_lanes, 1)
    else:
        words = None
        src, src_bits, out_bits, lanes = data, bits(data), bits(out), D
    # Without return_lse the kernel never touches lse_out_ptr (nor lse_ptr when the LSE is
    # packed): they get a tensor we already have instead of an allocation per call.
    lse_out = torch.empty((B, hpr), dtype=torch.float32, device=dev) if return_lse else None
    wide = needs_int64(src, out) or (lse is not None and needs_int64(lse))
    cfg = combine_launch(N, B, hpr, lanes)
    grid, kw = cached_plan(
        _PLANS, cfg, (N, B, hpr, lanes, lse_lanes, return_lse, is_lse_base_on_e, dtype,
                      words is not None, wide),
        lambda: _combine_plan(cfg, N, B, hpr, lanes, lse_lanes, return_lse, is_lse_base_on_e,
                              dtype, words is not None, wide))
    placeholder = lse_out if lse_out is not None else out
    args = (src, src_bits, lse if lse is not None else placeholder, out, out_bits, placeholder,
            B, hpr, lanes, *src.stride(), *(lse.stride() if lse is not None else (0, 0, 0)),
            *out_bits.stride())
    return grid, args, kw, out, lse_out


def _combine(data, lse, N, B, hpr, D, lse_lanes, return_lse, is_lse_base_on_e,
             with_site=False, out=None):
    """(the merged result, the launch's Site or None); see combine_launch_args."""
    grid, args, kw, out, lse_out = combine_launch_args(
        data, lse, N, B, hpr, D, lse_lanes, return_lse, is_lse_base_on_e, out)
    site = None
    if B and hpr:
        if with_site:
            site = bind(combine_rows, grid, *args, **kw)
        else:
            launch(combine_rows, grid, *args, **kw)
    return ((out, lse_out) if return_lse else out), site


def combine_packed(recv, head_dim, return_lse, is_lse_base_on_e, with_site=False, out=None):
    """Merge the wire buffer ``recv[N, B, H/N, D+P]`` into ``out[B, H/N, D]`` in recv's dtype
    (a fresh tensor, or the caller's ``out``; and the float32 merged ``lse[B, H/N]`` with
    ``return_lse``). The kernel reads the whole rows (the same pointer and strides as their
    first D lanes, without a slice per call). ``with_site``: also return the launch's Site
    (addresses: recv, recv, the LSE out or out, out, out, the LSE out or out), for a caller
    that repeats the problem."""
    N, B, hpr, lanes = recv.shape
    res, site = _combine(recv, None, N, B, hpr, head_dim, lanes - head_dim,
                         return_lse, is_lse_base_on_e, with_site, out)
    return (res, site) if with_site else res


def combine_separate(data, lse, return_lse, is_lse_base_on_e, out=None):
    """Merge ``data[N, B, H/N, D]`` with fp32 ``lse[N, B, H/N]`` (two-collective layout):
    the same kernel and arithmetic as :func:`combine_packed`; only the LSE's location differs."""
    N, B, hpr, D = data.shape
    return _combine(data, lse, N, B, hpr, D, 0, return_lse, is_lse_base_on_e, out=out)[0]


def scale_for_reduce_scatter(out, lse_all, rank, return_lse, is_lse_base_on_e, dst):
    """AG+RS local step. ``out[B, H, D]``, ``lse_all[N, B, H]`` fp32 (already masked).

    Writes ``dst[N, B, H/N, D]`` in out's dtype (slice r goes to rank r, summed there) and
    returns this rank's merged LSE ``[B, H/N]`` fp32.
    """
    N, B, H = lse_all.shape
    D = out.shape[2]
    hpr = H // N
    lse_out = torch.empty((B, hpr), dtype=torch.float32, device=out.device)
    if B == 0 or H == 0:
        return lse_out
    cfg = scale_launch(N, B, H, D)
    launch(
        _scale_kernel, cfg.grid(B, H),
        out, bits(out), lse_all.contiguous(), dst, bits(dst), lse_out, B, H, hpr, D, rank,
        out.stride(0), out.stride(1), out.stride(2),
        N=N, BASE_E=is_lse_base_on_e, RETURN_LSE=return_lse, IS_BF16=out.dtype == torch.bfloat16,
        BLOCK_B=cfg.block_b, BLOCK_H=cfg.block_h, BLOCK_D=cfg.block_d,
        num_warps=cfg.num_warps, **NO_CONTRACTION,
    )
    return lse_out
