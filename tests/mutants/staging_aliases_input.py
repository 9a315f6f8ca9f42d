"""Aliasing: the project's pack kernel launched without the overlap check, so a staging buffer carved from the attention output's memory overwrites the input it packs."""

import triton

import dcp_a2a
from dcp_a2a import pack as _pack
from dcp_a2a._launch import bits, require_runnable_device
from dcp_a2a.wire import (check_head_split, check_output_and_lse, check_seq_meta,
                          check_wire_buffer, require_int, require_same_device, wire_shape)

lse_pack_dim, unpack_combine, lse_reduce = (dcp_a2a.lse_pack_dim, dcp_a2a.unpack_combine,
                                            dcp_a2a.lse_reduce)


def pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None):
    # every check of dcp_a2a.pack.pack_send except require_disjoint(send, out, lse)
    B, H, D = check_output_and_lse(out, lse)
    hpr = check_head_split(H, world_size)
    require_int("h_per_rank", h_per_rank, 1 if H else 0)
    if h_per_rank != hpr:
        raise ValueError(f"h_per_rank={h_per_rank} but H/N = {H}/{world_size} = {hpr}")
    require_int("head_dim", head_dim, 1)
    if head_dim != D:
        raise ValueError(f"head_dim={head_dim} does not match out's last dim {D}")
    p = dcp_a2a.lse_pack_dim(out.dtype)
    if lse_pack_dim != p:
        raise ValueError(f"lse_pack_dim={lse_pack_dim} does not match {out.dtype} (expected {p})")
    check_wire_buffer("send", send, head_dim=D, lse_pack_dim_=p, dtype=out.dtype,
                      expected_shape=wire_shape(world_size, B, hpr, D, out.dtype))
    require_same_device(out=out, lse=lse, send=send)
    check_seq_meta(seq_lens, query_start_loc, B, out.device)
    if B == 0 or H == 0:
        return
    require_runnable_device(out)
    sl, qsl, num_seqs, steps, has_mask = _pack._mask_args(seq_lens, query_start_loc, out)
    block_h = _pack._block_h(H, D)
    _pack._pack_kernel[(B, triton.cdiv(H, block_h))](
        bits(out), lse, bits(send), sl, qsl,
        B, H, hpr, D, num_seqs, steps,
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        P=p, HAS_MASK=has_mask, BLOCK_H=block_h, BLOCK_D=_pack._block_d(D),
    )
