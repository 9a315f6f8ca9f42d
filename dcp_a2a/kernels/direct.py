"""Direct exchange: the pack kernel stores each slice into its owner's receive buffer, the
combine kernel waits for every peer's signal and merges from its own buffer.

Memory of one group of N ranks (each rank holds the same, :class:`dcp_a2a.symm_mem.PeerTables`):

    recv[2, N, B, H/N, D+P]   this rank's receive buffer, two slots (the wire format per slot);
                              peers write slot ``e % 2`` of call ``e`` at [slot, sender, ...]
    flags[N] int64            flags[s] = the number of calls whose slice rank s has delivered
    epoch int64, counter int32   local: this rank's call count, the pack programs arrived

One call ``e`` (all ranks make the same calls in the same order):

1. pack (``_pack_to_peers_kernel``): every program stores its rows into the owners' slot e % 2,
   then arrives on ``counter`` (a release at system scope after a CTA barrier); the last program
   to arrive sets ``epoch = e + 1`` and stores ``e + 1`` into ``flags[rank]`` of every rank with
   release semantics at system scope.
2. combine (``_combine_from_peers_kernel``): every program loads ``E = epoch`` (= e + 1), spins
   until ``flags[s] >= E`` for every s (acquire at system scope), then merges slot (E - 1) % 2
   with the same ``combine_rows`` as the packed path, so the results are bitwise equal.

Why two slots and one signal per call suffice: rank s writes slot e % 2 of rank r again only at
call e + 2, after its combine of call e + 1 saw rank r's flag reach e + 2, which rank r stores
after its pack of call e + 1 and so after (stream order) its combine of call e finished reading
that slot. Flags only grow (int64, no reset), so a flag that is already one call ahead is fine.
Everything is on the device: no host synchronisation, and a CUDA graph replays it as is.

The launchers here trust their input: :func:`dcp_a2a.lse_reduce` checks it first.
"""

from __future__ import annotations

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before the kernels are defined)

import triton
import triton.language as tl

from .combine import combine_launch_args, combine_rows
from .merge_math import program_rows
from .pack import lanes_of, mask_args, write_rows
from .tuning import pack_launch


@triton.jit
def _acquire_load(ptr, ASM: tl.constexpr):
    """``*ptr`` (int64) with acquire semantics at system scope. The compiled path uses a plain
    ld.acquire (no read-modify-write, so thousands of programs can poll one flag without
    serialising on it); Triton's interpreter has no inline assembly and runs programs one at a
    time, where an atomic add of 0 is the same load."""
    if ASM:
        return tl.inline_asm_elementwise(
            "ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [ptr],
            dtype=tl.int64, is_pure=False, pack=1)
    else:
        return tl.atomic_add(ptr, 0, sem="acquire", scope="sys")


# ``rank`` only addresses (the flag a program raises): left unspecialised, the ranks share one
# compiled kernel where Triton would compile rank 0, rank 1 and the rest apart
@triton.jit(do_not_specialize=["rank"])
def _pack_to_peers_kernel(
    out_bits_ptr, lse_ptr, recv_bits_ptr, peer_recv_ptrs, peer_flag_ptrs, counter_ptr, epoch_ptr,
    seq_lens_ptr, qsl_ptr,
    B, H, HPR, D, num_seqs, steps, rank, slot_lanes,
    s_ob, s_oh, s_od, s_lb, s_lh,
    N: tl.constexpr, P: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, STREAM: tl.constexpr,
    ONE_TILE: tl.constexpr, LANE_LOADS: tl.constexpr, HEAD_MAJOR: tl.constexpr,
):
    """Step 1 of the module docstring, for this program's rows (b, h) (as the pack kernel).
    ``recv_bits_ptr`` (this rank's buffer) only gives the lane type of the peers' buffers;
    ``slot_lanes`` is one slot's size in those lanes."""
    b, h, row_ok = program_rows(B, H, BLOCK_B, BLOCK_H, True, HEAD_MAJOR)
    e = tl.load(epoch_ptr)
    owner = h // HPR
    base = tl.load(peer_recv_ptrs + owner, mask=row_ok, other=0)
    base = base.to(tl.pointer_type(recv_bits_ptr.dtype.element_ty))
    row = (e % 2) * slot_lanes + ((rank * B + b) * HPR + h % HPR) * (D + P)
    write_rows(out_bits_ptr, lse_ptr, base + row, seq_lens_ptr, qsl_ptr, b, h, row_ok,
               D, num_seqs, steps, s_ob, s_oh, s_od, s_lb, s_lh,
               P, HAS_MASK, BLOCK_D, STREAM, ONE_TILE, LANE_LOADS)

    # Arrive: every thread's stores are issued before the CTA barrier, and the release at
    # system scope that follows orders them before the arrival (and, through the last
    # program's acquire, before its signals).
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="sys")
    if arrived == tl.num_programs(0) * tl.num_programs(1) - 1:
        tl.store(counter_ptr, 0)
        tl.store(epoch_ptr, e + 1)
        for p in tl.static_range(N):
            flags = tl.load(peer_flag_ptrs + p).to(tl.pointer_type(tl.int64))
            tl.atomic_xchg(flags + rank, e + 1, sem="release", scope="sys")


@triton.jit
def _combine_from_peers_kernel(
    data_ptr, data_bits_ptr, lse_ptr, out_ptr, out_bits_ptr, lse_out_ptr,
    B, HPR, D,
    s_dn, s_db, s_dh, s_dd, s_ln, s_lb, s_lh, s_ob, s_oh, s_od,
    flags_ptr, epoch_ptr, slot_lanes,
    N: tl.constexpr, LSE_LANES: tl.constexpr, BASE_E: tl.constexpr,
    RETURN_LSE: tl.constexpr, IS_BF16: tl.constexpr, PAIRS: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, STREAM: tl.constexpr, ONE_TILE: tl.constexpr, WIDE: tl.constexpr,
    NATIVE_BF16: tl.constexpr, SPLIT_D: tl.constexpr, HEAD_MAJOR: tl.constexpr,
    ASM: tl.constexpr,
):
    """Step 2 of the module docstring: wait for the N slices of this call, merge its slot."""
    target = tl.load(epoch_ptr)
    for s in tl.static_range(N):
        seen = _acquire_load(flags_ptr + s, ASM)
        while seen < target:
            seen = _acquire_load(flags_ptr + s, ASM)
    off = ((target - 1) % 2) * slot_lanes
    combine_rows(data_ptr + off, data_bits_ptr + off, lse_ptr, out_ptr, out_bits_ptr,
                 lse_out_ptr, B, HPR, D, s_dn, s_db, s_dh, s_dd, s_ln, s_lb, s_lh,
                 s_ob, s_oh, s_od, N, LSE_LANES, BASE_E, RETURN_LSE, IS_BF16, PAIRS,
                 BLOCK_B, BLOCK_H, BLOCK_D, STREAM, ONE_TILE, WIDE, NATIVE_BF16, SPLIT_D,
                 HEAD_MAJOR)


def pack_to_peers(out, lse, tables, seq_lens=None, query_start_loc=None) -> None:
    """Step 1 for ``out[B, H, D]``, ``lse[B, H]`` into the peers' buffers of ``tables``
    (a :class:`dcp_a2a.symm_mem.PeerTables`; B >= 1, B <= its capacity, H and D its own)."""
    B, H, D = out.shape
    src, lanes, lanes_p, paired = lanes_of(out, tables.lse_lanes)
    sl, qsl, num_seqs, steps, has_mask = mask_args(seq_lens, query_start_loc, src)
    recv = tables.recv_lanes(paired)
    cfg = pack_launch(B, H, lanes, tables.world_size)
    _pack_to_peers_kernel[cfg.grid(B, H)](
        src, lse, recv, tables.peer_recv_ptrs, tables.peer_flag_ptrs, tables.counter,
        tables.epoch, sl, qsl,
        B, H, tables.h_per_rank, lanes, num_seqs, steps, tables.rank,
        recv.numel() // 2,
        src.stride(0), src.stride(1), src.stride(2), lse.stride(0), lse.stride(1),
        N=tables.world_size, P=lanes_p, HAS_MASK=has_mask, BLOCK_B=cfg.block_b,
        BLOCK_H=cfg.block_h,
        BLOCK_D=cfg.block_d, STREAM=cfg.stream, ONE_TILE=cfg.block_d >= lanes,
        LANE_LOADS=cfg.lane_loads, HEAD_MAJOR=cfg.head_major, num_warps=cfg.num_warps,
    )


def combine_from_peers(tables, batch, return_lse, is_lse_base_on_e, out=None):
    """Step 2: ``out[B, H/N, D]`` (a fresh tensor, or the caller's ``out``) and, with
    ``return_lse``, the fp32 merged ``lse[B, H/N]`` of this call."""
    N, hpr, D = tables.world_size, tables.h_per_rank, tables.head_dim
    slot0 = tables.slot_view(0, batch)  # the layout; the kernel picks the call's slot
    grid, args, kw, out, lse_out = combine_launch_args(
        slot0, None, N, batch, hpr, D, tables.lse_lanes, return_lse, is_lse_base_on_e, out)
    lanes_per_slot = tables.recv.numel() // 2 // (2 if kw["PAIRS"] else 1)
    _combine_from_peers_kernel[grid](
        *args, tables.flags, tables.epoch, lanes_per_slot, ASM=not _env.INTERPRET, **kw)
    return (out, lse_out) if return_lse else out
