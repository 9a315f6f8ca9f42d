"""The wire format in plain PyTorch views (a second, independent implementation).

send/recv ``[N, B, H/N, D + P]`` in the output dtype; lanes [0, D) the partial output, lanes
[D, D+P) the float32 LSE's 4 bytes in memory order (P = 2 for 16-bit dtypes: low half, high
half; P = 1 for float32). This module also serves as a correct implementation of the contract's
``pack_send`` / ``unpack_combine`` for CPU use (e.g. the end-to-end evals).
"""

from __future__ import annotations

import math

import torch

from .combine import lse_weighted_combine


def lse_pack_dim(dtype: torch.dtype) -> int:
    """2 for float16/bfloat16, 1 for float32; ValueError naming any other dtype."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"lse_pack_dim expects a torch.dtype, got {type(dtype).__name__}")
    if dtype in (torch.float16, torch.bfloat16):
        return 2
    if dtype == torch.float32:
        return 1
    raise ValueError(f"unsupported output dtype {dtype} for the packed DCP exchange: only "
                     "torch.float16, torch.bfloat16 and torch.float32 have a wire format")


def _lse_lanes(buf: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The LSE lanes of ``buf`` as a float32 view [N, B, H/N] (shares memory)."""
    int_t = torch.int16 if buf.element_size() == 2 else torch.int32
    lanes = buf.view(int_t)[..., head_dim:]
    if not lanes.shape[-1]:
        return lanes
    # a fresh buffer: .contiguous() may return the slice itself (size-1 dims), whose storage
    # offset (head_dim 16-bit words) cannot be viewed as float32 when head_dim is odd
    fresh = torch.empty(lanes.shape, dtype=lanes.dtype, device=lanes.device).copy_(lanes)
    return fresh.view(torch.float32).squeeze(-1)


def row_mask(num_rows: int, seq_lens, query_start_loc, device=None) -> torch.Tensor:
    """Bool [B] on the metadata's device (``device``, default CPU, without metadata): rows with
    no local KV (their request's seq_len is 0) or padding rows (before ``query_start_loc[0]``
    or from ``query_start_loc[-1]`` on).

    No host synchronisation (the search runs on the metadata's device, its trip count comes
    from shapes), so the contract's pack can be captured in a CUDA graph like the kernels'.

    The request of row b is found by the binary search the kernels run: with the contract's
    precondition (query_start_loc non-decreasing) it is the last s with
    ``query_start_loc[s] <= b``; on any other input this search and the kernels' still make the
    same decisions, so the two implementations agree on every input.
    """
    if seq_lens is None:
        return torch.zeros(num_rows, dtype=torch.bool, device=device)
    qsl = query_start_loc.to(torch.int64)
    sl = seq_lens.to(qsl.device, torch.int64)
    n = sl.numel()
    rows = torch.arange(num_rows, device=qsl.device)
    if n == 0:  # no request: every row is padding
        return torch.ones(num_rows, dtype=torch.bool, device=qsl.device)
    lo = torch.zeros(num_rows, dtype=torch.int64, device=qsl.device)
    hi = torch.full((num_rows,), n - 1, dtype=torch.int64, device=qsl.device)
    for _ in range(0 if n <= 1 else math.ceil(math.log2(n))):
        mid = (lo + hi + 1) // 2
        go = qsl[mid] <= rows
        lo = torch.where(go, mid, lo)
        hi = torch.where(go, hi, mid - 1)
    return (rows >= qsl[n]) | (rows < qsl[0]) | (sl[lo] <= 0)


def pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None) -> None:
    B, H, D = out.shape
    if H % world_size:
        raise ValueError(f"H={H} is not divisible by N={world_size}")
    if (seq_lens is None) != (query_start_loc is None):
        raise ValueError("seq_lens and query_start_loc must be given together")
    expected = (world_size, B, h_per_rank, head_dim + lse_pack_dim)
    if tuple(send.shape) != expected or send.dtype != out.dtype:
        raise ValueError(f"send must be {expected} {out.dtype}, got {tuple(send.shape)} "
                         f"{send.dtype}")
    send[..., :D].copy_(out.unflatten(1, (world_size, h_per_rank)).transpose(0, 1))
    lse32 = lse.to(torch.float32).clone()
    lse32.masked_fill_(row_mask(B, seq_lens, query_start_loc, lse32.device)[:, None], -math.inf)
    lse_wire = lse32.unflatten(1, (world_size, h_per_rank)).transpose(0, 1).contiguous()
    int_t = torch.int16 if send.element_size() == 2 else torch.int32
    send.view(int_t)[..., D:].copy_(lse_wire.view(int_t).view(*lse_wire.shape, -1))


def unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
    if recv.shape[-1] != head_dim + lse_pack_dim:
        raise ValueError(f"recv last dim {recv.shape[-1]} != head_dim + P")
    data = recv[..., :head_dim]
    lses = _lse_lanes(recv, head_dim)
    res = lse_weighted_combine(data, lses, return_lse=True, is_lse_base_on_e=is_lse_base_on_e)
    out = res[0].to(recv.dtype)
    return (out, res[1].to(torch.float32)) if return_lse else out
