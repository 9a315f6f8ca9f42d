"""A correct implementation of the contract written from scratch, in an engine's idiom: the
self-check runs it beside the reference contract and ``freedoms`` (both built on
:class:`dcp_a2a.reference.contract.ReferenceContract`), so a test that leans on the reference's
internals, and not on the contract, fails here.

Where it differs from the reference: module-level functions and checks of its own (other
words, another order); the row-to-request map of the masks by ``torch.searchsorted``; the merge
in float32 (global max, weights normalised, ranks in order); a group of one returns its inputs
themselves when nothing is masked (vLLM's does), masked copies otherwise; the exchange's send
and receive buffers are ``torch.empty`` on every call. No host synchronisation anywhere, so it
captures in CUDA graphs.

    dcp-a2a self-check --correct dcp_a2a.testing.independent --no-mutants
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

_OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LSE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX_DTYPES = (torch.int32, torch.int64)
_LANE_INT = {2: torch.int16, 4: torch.int32}  # the integer type of a wire lane, by width


def lse_pack_dim(dtype):
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"expected a torch.dtype, got {dtype!r}")
    if dtype not in _OUTPUT_DTYPES:
        raise ValueError(f"unsupported attention output dtype {dtype}")
    return 1 if dtype == torch.float32 else 2


def _positive_int(name, v):
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{name} must be >= 1, got {v}")


def _check_partial(out, lse):
    if not isinstance(out, torch.Tensor) or not isinstance(lse, torch.Tensor):
        raise TypeError("out and lse must be tensors")
    if out.dtype not in _OUTPUT_DTYPES:
        raise ValueError(f"unsupported out dtype {out.dtype}")
    if lse.dtype not in _LSE_DTYPES:
        raise ValueError(f"unsupported lse dtype {lse.dtype}")
    if out.dim() != 3 or lse.dim() != 2 or tuple(lse.shape) != tuple(out.shape[:2]):
        raise ValueError(f"expected out [B, H, D] and lse [B, H], got {tuple(out.shape)} and "
                         f"{tuple(lse.shape)}")
    if out.device != lse.device:
        raise ValueError(f"out is on {out.device}, lse on {lse.device}")


def _empty_rows(b, seq_lens, qsl, device):
    """Bool [B]: rows of a request without local KV, and padding rows."""
    if seq_lens is None and qsl is None:
        return torch.zeros(b, dtype=torch.bool, device=device)
    if seq_lens is None or qsl is None:
        raise ValueError("seq_lens and query_start_loc go together: got only one of them")
    for name, t in (("seq_lens", seq_lens), ("query_start_loc", qsl)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-d tensor")
        if t.dtype not in _INDEX_DTYPES:
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, out on {device}")
    if qsl.numel() != seq_lens.numel() + 1:
        raise ValueError(f"query_start_loc needs len(seq_lens) + 1 = {seq_lens.numel() + 1} "
                         f"entries, got {qsl.numel()}")
    starts = qsl.to(torch.int64)
    rows = torch.arange(b, device=device)
    padding = (rows < starts[0]) | (rows >= starts[-1])
    if seq_lens.numel() == 0:
        return padding
    request = (torch.searchsorted(starts, rows, right=True) - 1).clamp(0, seq_lens.numel() - 1)
    return padding | (seq_lens.to(torch.int64)[request] == 0)


def _disjoint(send, **tensors):
    if send.numel() == 0:
        return
    s0 = send.data_ptr()
    s1 = s0 + send.numel() * send.element_size()
    for name, t in tensors.items():
        if t.numel() == 0:
            continue
        extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1
        t0 = t.data_ptr()
        if s0 < t0 + extent * t.element_size() and t0 < s1:
            raise ValueError(f"the send buffer overlaps {name}")


def pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None):
    _check_partial(out, lse)
    for name, v in (("world_size", world_size), ("h_per_rank", h_per_rank),
                    ("head_dim", head_dim), ("lse_pack_dim", lse_pack_dim)):
        _positive_int(name, v)
    b, h, d = out.shape
    if h % world_size:
        raise ValueError(f"{h} heads are not divisible by the world size {world_size}")
    if h_per_rank != h // world_size or head_dim != d:
        raise ValueError(f"h_per_rank {h_per_rank} / head_dim {head_dim} contradict out "
                         f"{tuple(out.shape)} over {world_size} ranks")
    p = globals()["lse_pack_dim"](out.dtype)
    if lse_pack_dim != p:
        raise ValueError(f"lse_pack_dim {lse_pack_dim}: {out.dtype} packs {p} lanes")
    want = (world_size, b, h_per_rank, d + p)
    if (not isinstance(send, torch.Tensor) or send.dtype != out.dtype
            or tuple(send.shape) != want or not send.is_contiguous()):
        raise ValueError(f"send must be a contiguous {out.dtype} tensor of shape {want}")
    if send.device != out.device:
        raise ValueError(f"send is on {send.device}, out on {out.device}")
    _disjoint(send, out=out, lse=lse)
    empty = _empty_rows(b, seq_lens, query_start_loc, out.device)
    lse32 = lse.to(torch.float32).masked_fill(empty[:, None], -math.inf)
    send[..., :d].copy_(out.reshape(b, world_size, h_per_rank, d).transpose(0, 1))
    bits = lse32.reshape(b, world_size, h_per_rank).transpose(0, 1).contiguous()
    bits = bits.view(torch.int32)
    lanes = send.view(_LANE_INT[send.element_size()])[..., d:]
    if p == 1:
        lanes[..., 0].copy_(bits)
    else:  # the float32's two 16-bit halves, low first (memory order)
        lanes[..., 0].copy_(bits.to(torch.int16))
        lanes[..., 1].copy_((bits >> 16).to(torch.int16))


def unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
    if not isinstance(recv, torch.Tensor) or recv.dim() != 4:
        raise ValueError("recv must be a [N, B, H/N, D+P] tensor")
    if recv.dtype not in _OUTPUT_DTYPES:
        raise ValueError(f"unsupported recv dtype {recv.dtype}")
    for name, v in (("return_lse", return_lse), ("is_lse_base_on_e", is_lse_base_on_e)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    _positive_int("head_dim", head_dim)
    p = globals()["lse_pack_dim"](recv.dtype)
    if lse_pack_dim != p or recv.shape[-1] != head_dim + p:
        raise ValueError(f"recv's rows hold {recv.shape[-1]} lanes, not head_dim + "
                         f"lse_pack_dim = {head_dim} + {p}")
    if recv.shape[0] < 1:
        raise ValueError("recv holds no rank's slice")
    recv = recv.contiguous()  # a strided recv is read by value
    lanes = recv.view(_LANE_INT[recv.element_size()])[..., head_dim:]
    if p == 1:
        s = lanes[..., 0].contiguous().view(torch.float32)
    else:
        s = ((lanes[..., 1].to(torch.int32) << 16)
             | (lanes[..., 0].to(torch.int32) & 0xFFFF)).view(torch.float32)
    s = torch.where(torch.isnan(s) | (s == math.inf), -math.inf, s)  # NaN/+inf weigh 0
    m = s.amax(0)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    exp, log = (torch.exp, torch.log) if is_lse_base_on_e else (torch.exp2, torch.log2)
    w = torch.where(torch.isinf(s), torch.zeros_like(s), exp(s - m))
    total = w.sum(0)
    some = total > 0
    total = torch.where(some, total, torch.ones_like(total))
    acc = torch.zeros(recv.shape[1:3] + (head_dim,), dtype=torch.float32, device=recv.device)
    for r in range(recv.shape[0]):  # rank order; a zero weight adds nothing, not 0 * NaN
        scale = (w[r] / total)[..., None]
        acc += torch.where(scale > 0, scale * recv[r, ..., :head_dim].to(torch.float32), 0.0)
    out = acc.to(recv.dtype)
    if not return_lse:
        return out
    return out, torch.where(some, m + log(total), torch.full_like(m, -math.inf))


def lse_reduce(out, lse, group, *, return_lse=False, is_lse_base_on_e=True, seq_lens=None,
               query_start_loc=None):
    n = group.world_size
    _positive_int("group.world_size", n)
    _check_partial(out, lse)
    b, h, d = out.shape
    if h % n:
        raise ValueError(f"{h} heads are not divisible by the DCP world size {n}")
    if n == 1:  # nothing to exchange: the inputs themselves, masked rows zeroed
        if seq_lens is None and query_start_loc is None:
            o, g = out, lse.to(torch.float32)
        else:
            empty = _empty_rows(b, seq_lens, query_start_loc, out.device)
            o = out.masked_fill(empty[:, None, None], 0)
            g = lse.to(torch.float32).masked_fill(empty[:, None], -math.inf)
        return (o, g) if return_lse else o
    p = lse_pack_dim(out.dtype)
    send = torch.empty((n, b, h // n, d + p), dtype=out.dtype, device=out.device)
    pack_send(out, lse, send, n, h // n, d, p, seq_lens=seq_lens,
              query_start_loc=query_start_loc)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group.device_group)
    return unpack_combine(recv, d, p, return_lse, is_lse_base_on_e)
