"""The public kernel entry points: check the arguments, then launch (the launchers in
:mod:`dcp_a2a.kernels` trust what they are given).

    pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None) -> None
    unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)
        -> out[B, H/N, D]  or  (out, lse[B, H/N] float32)

Shapes, dtypes and the wire format ``[N, B, H/N, D+P]`` are described in :mod:`dcp_a2a.wire`.
"""

from __future__ import annotations

from .kernels import combine as _combine
from .kernels import pack as _pack
from .wire import (
    check_head_split,
    check_output_and_lse,
    check_seq_meta,
    check_wire_buffer,
    lse_pack_dim as _lse_pack_dim,
    require_bool,
    require_disjoint,
    require_int,
    require_runnable_device,
    require_same_device,
)


def pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None) -> None:
    """Write ``send[N, B, H/N, D+P]`` from ``out[B, H, D]`` and ``lse[B, H]``.

    ``out`` in fp16/bf16/fp32, any strides; ``lse`` in fp32/bf16/fp16 (converted to fp32, never
    rounded). ``seq_lens[num_seqs]`` (this rank's local KV length per request) and
    ``query_start_loc[num_seqs + 1]`` (cumulative query rows, non-decreasing) mask empty and
    padding rows: their LSE is sent as -inf. Raises ValueError/TypeError for any inconsistent
    argument, before the launch.
    """
    B, H, D = check_output_and_lse(out, lse)
    hpr = check_head_split(H, world_size)  # world_size: an int >= 1, then the split
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
                      expected_shape=(world_size, B, hpr, D + p))
    if send.device != out.device:  # out and lse were compared above
        require_same_device(out=out, lse=lse, send=send)
    check_seq_meta(seq_lens, query_start_loc, B, out.device)
    require_disjoint("send", send, out=out, lse=lse)
    if B and H:
        require_runnable_device(out)
    _pack.pack(out, lse, send, hpr, seq_lens, query_start_loc)


def unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
    """Merge the received wire buffer ``recv[N, B, H/N, D+P]``.

    Returns ``out[B, H/N, D]`` in recv's dtype, and ``(out, lse[B, H/N] float32)`` when
    ``return_lse``. ``is_lse_base_on_e=False`` merges with exp2/log2 and returns a base-2 LSE.
    """
    require_int("head_dim", head_dim, 1)
    require_bool("return_lse", return_lse)
    require_bool("is_lse_base_on_e", is_lse_base_on_e)
    N, B, hpr = check_wire_buffer("recv", recv, head_dim=head_dim, lse_pack_dim_=lse_pack_dim)
    if N < 1:
        raise ValueError("recv must hold at least one peer slice (N >= 1)")
    if B and hpr:
        require_runnable_device(recv)
    return _combine.combine_packed(recv, head_dim, return_lse, is_lse_base_on_e)
