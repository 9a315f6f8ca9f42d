"""The packed wire format and the checks every public entry point shares.

Wire format (send and receive buffers are identical in layout)::

    buf[N, B, H/N, D + P]   dtype = the attention output's dtype (fp16, bf16 or fp32)
        axis 0  peer r: the slice sent to / received from rank r
        axis 1  token (batch row) b
        axis 2  local head j: global head r*H/N + j on the sending side
        axis 3  lanes [0, D): the partial output, bit-exact
                lanes [D, D+P): the float32 log-sum-exp, as raw bits
                   P = 1 (fp32 buffer): lane D holds the 32 bits
                   P = 2 (16-bit buffer): lane D the low 16 bits, lane D+1 the high 16 bits

The LSE is converted to float32 before packing (exact for fp16/bf16 inputs) and never rounded
to the output dtype; its bits round-trip exactly, NaN payloads included.
"""

from __future__ import annotations

import torch

from . import _env

OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LSE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)

# The integer type of the same width, through which the kernels move raw bits.
BITS_DTYPE = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}
# P of each output dtype: a dict lookup on every call's hot path (host time per call)
_LSE_LANES = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 1}


def lse_pack_dim(dtype: torch.dtype) -> int:
    """Number of trailing lanes P that carry the float32 LSE in a buffer of ``dtype``.

    2 for float16/bfloat16, 1 for float32. Any other dtype (every float8 variant, float64,
    integer and bool dtypes) raises ``ValueError`` naming it: the wire format is only defined
    for these three.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"lse_pack_dim expects a torch.dtype, got {type(dtype).__name__}")
    p = _LSE_LANES.get(dtype)
    if p is not None:
        return p
    raise ValueError(
        f"unsupported output dtype {dtype} for the packed DCP exchange: "
        "only torch.float16, torch.bfloat16 and torch.float32 have a wire format "
        "(float8 cannot carry the fp32 LSE bits; float64 has no packed layout)"
    )


def require_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def require_int(name: str, v, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def check_group(group) -> tuple[int, int]:
    """The DCP group's (world_size, rank): ``group`` is any object with ``world_size``,
    ``rank_in_group`` and ``device_group`` (an engine's group coordinator); TypeError naming
    the missing attribute otherwise (``None`` included), ValueError for a rank outside the
    group. The same check, and message, as ``lse_reduce``'s."""
    for attr in ("world_size", "rank_in_group", "device_group"):
        if not hasattr(group, attr):
            raise TypeError(
                f"group must have world_size, rank_in_group and device_group; "
                f"{type(group).__name__} has no {attr}"
            )
    n = require_int("group.world_size", group.world_size, 1)
    r = require_int("group.rank_in_group", group.rank_in_group, 0)
    if r >= n:
        raise ValueError(f"group.rank_in_group={r} is not below world_size={n}")
    return n, r


def require_bool(name: str, v) -> None:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")


def require_same_device(**tensors) -> None:
    first = None
    for t in tensors.values():
        if t is None:
            continue
        if first is None:
            first = t.device
        elif t.device != first:  # the listing is built only to raise
            listing = ", ".join(f"{k} on {v.device}" for k, v in tensors.items()
                                if v is not None)
            raise ValueError(f"tensors must be on one device, got {listing}")


def check_output_and_lse(out: torch.Tensor, lse: torch.Tensor) -> tuple[int, int, int]:
    """Validate the attention partial ``out[B, H, D]`` and its ``lse[B, H]``; return (B, H, D)."""
    require_tensor("out", out)
    require_tensor("lse", lse)
    lse_pack_dim(out.dtype)  # raises for unsupported output dtypes
    shape, lse_shape = out.shape, lse.shape
    if len(shape) != 3:
        raise ValueError(f"out must be 3-D [B, H, D], got shape {tuple(shape)}")
    if len(lse_shape) != 2:
        raise ValueError(f"lse must be 2-D [B, H], got shape {tuple(lse_shape)}")
    if lse.dtype not in LSE_DTYPES:
        raise ValueError(
            f"unsupported lse dtype {lse.dtype}: expected one of float32, bfloat16, float16"
        )
    B, H, D = shape
    if lse_shape[0] != B or lse_shape[1] != H:
        raise ValueError(
            f"out/lse shape mismatch: out is {tuple(shape)} so lse must be "
            f"{(B, H)}, got {tuple(lse_shape)}"
        )
    if lse.device != out.device:
        require_same_device(out=out, lse=lse)
    if D < 1:
        raise ValueError(f"head_dim must be >= 1, got {D}")
    return B, H, D


def check_seq_meta(seq_lens, query_start_loc, num_rows: int, device: torch.device) -> None:
    """``seq_lens`` and ``query_start_loc`` go together: both or neither."""
    if (seq_lens is None) != (query_start_loc is None):
        given = "seq_lens" if seq_lens is not None else "query_start_loc"
        missing = "query_start_loc" if seq_lens is not None else "seq_lens"
        raise ValueError(f"{given} was given without {missing}: pass both or neither")
    if seq_lens is None:
        return
    require_tensor("seq_lens", seq_lens)
    require_tensor("query_start_loc", query_start_loc)
    for name, t in (("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        if t.dtype not in INDEX_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but the attention output is on {device}")
    if query_start_loc.numel() != seq_lens.numel() + 1:
        raise ValueError(
            "query_start_loc must have len(seq_lens) + 1 entries, got "
            f"{query_start_loc.numel()} for {seq_lens.numel()} sequences"
        )


def check_head_split(num_heads: int, world_size: int) -> int:
    require_int("world_size", world_size, 1)
    if num_heads % world_size != 0:
        raise ValueError(
            f"number of heads H={num_heads} is not divisible by the DCP world size N={world_size}"
        )
    return num_heads // world_size


def wire_shape(world_size: int, batch: int, h_per_rank: int, head_dim: int, dtype) -> tuple:
    return (world_size, batch, h_per_rank, head_dim + lse_pack_dim(dtype))


def check_wire_buffer(name: str, buf, *, head_dim: int, lse_pack_dim_: int, expected_shape=None,
                      dtype=None) -> tuple[int, int, int]:
    """Validate a send/recv buffer; return (N, B, H/N)."""
    require_tensor(name, buf)
    buf_dtype = buf.dtype
    p = lse_pack_dim(buf_dtype)
    if dtype is not None and buf_dtype != dtype:
        raise ValueError(f"{name} dtype {buf_dtype} does not match the output dtype {dtype}")
    require_int("lse_pack_dim", lse_pack_dim_, 1)
    if lse_pack_dim_ != p:
        raise ValueError(
            f"lse_pack_dim={lse_pack_dim_} does not match {name} dtype {buf_dtype} (expected {p})"
        )
    shape = buf.shape
    if len(shape) != 4:
        raise ValueError(f"{name} must be 4-D [N, B, H/N, D+P], got shape {tuple(shape)}")
    if shape[3] != head_dim + p:
        raise ValueError(
            f"{name} last dim is {shape[3]} but head_dim={head_dim} + lse_pack_dim={p} "
            f"= {head_dim + p}"
        )
    if expected_shape is not None and shape != tuple(expected_shape):
        raise ValueError(
            f"{name} has shape {tuple(shape)}, expected {tuple(expected_shape)}"
        )
    if not buf.is_contiguous():
        raise ValueError(f"{name} must be contiguous (it is the wire buffer of a collective)")
    return shape[0], shape[1], shape[2]


def require_runnable_device(t: torch.Tensor) -> None:
    """The kernels run on CUDA tensors, or on CPU tensors through Triton's interpreter."""
    # is_meta / is_cpu: flags read in C (``t.device.type`` builds a device object first)
    if t.is_meta:
        raise ValueError("meta tensors have no data for the kernels to read; pass real tensors "
                         "(CUDA, or CPU with Triton's interpreter)")
    if t.is_cpu and not _env.INTERPRET:
        raise ValueError(
            "CPU tensors need the Triton interpreter: unset TRITON_INTERPRET (dcp_a2a then "
            "enables it on machines without CUDA) or set TRITON_INTERPRET=1 before importing "
            "dcp_a2a; or use the pure-PyTorch implementation in dcp_a2a.reference.contract"
        )


def reach(t: torch.Tensor) -> int:
    """Elements from ``t``'s first element to one past the last it can touch (0 when empty):
    a function of its shape and strides alone."""
    numel = t.numel()
    if numel == 0:
        return 0
    if t.is_contiguous():  # the common case, without a Python loop over the dims
        return numel
    extent = 1
    for s, st in zip(t.shape, t.stride()):
        extent += (s - 1) * abs(st)
    return extent


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte] that ``t`` can touch."""
    start = t.data_ptr()
    return (start, start + reach(t) * t.element_size())


def require_disjoint(dst_name: str, dst: torch.Tensor, **sources: torch.Tensor) -> None:
    """A kernel that writes ``dst`` while reading ``sources`` must not see them overlap.

    Staging buffers carved from the same workspace as the attention output they pack made the
    pack kernel overwrite its own input in a shipped engine; refuse it here instead.
    """
    if dst.numel() == 0 or dst.is_meta:
        return
    d0, d1 = _span(dst)
    device = dst.device
    for name, src in sources.items():
        if src is None or src.numel() == 0 or src.device != device:
            continue
        s0, s1 = _span(src)
        if d0 < s1 and s0 < d1:
            raise ValueError(
                f"{dst_name} overlaps {name} in memory ({dst_name} bytes [{d0:#x}, {d1:#x}), "
                f"{name} bytes [{s0:#x}, {s1:#x})): a staging buffer must not alias the "
                "tensors it is built from"
            )


def check_into(into, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """A caller's result buffer ``into``: a tensor of exactly ``shape``, ``dtype`` and
    ``device`` (any strides, but no two elements at one address: the kernel writes each
    element once, in no fixed order), not a meta tensor, not requiring grad (the result
    carries no gradient). Overlap with what the call reads is checked on every call
    (:func:`require_disjoint`), not here."""
    if not isinstance(into, torch.Tensor):
        raise TypeError(f"into must be a torch.Tensor (the caller's result buffer) or None, "
                        f"got {type(into).__name__}")
    if tuple(into.shape) != tuple(shape):
        raise ValueError(f"into has shape {tuple(into.shape)}, expected {tuple(shape)} "
                         "([B, H/N, D]: this rank's heads of the merged result)")
    if into.dtype != dtype:
        raise ValueError(f"into has dtype {into.dtype}, expected {dtype} (the output dtype)")
    if into.device != device:
        raise ValueError(f"into is on {into.device}, expected {device} (where the call runs)")
    if into.is_meta:
        raise ValueError("into is a meta tensor: it has no memory to write the result to")
    if into.requires_grad:
        raise ValueError("into requires grad: the combine writes its result without autograd "
                         "(pass a buffer that does not require grad, e.g. under "
                         "torch.no_grad() or .detach())")
    if into.numel() > 1 and torch._debug_has_internal_overlap(into) == 1:
        raise ValueError(f"into has strides {into.stride()} that put several elements at one "
                         "address (an expanded or broadcast view): the result needs one "
                         "address per element")


def check_w_uv(w_uv, heads: int, latent: int, dtype: torch.dtype, device: torch.device) -> int:
    """MLA's up-projection ``w_uv[H, L, V]`` for a latent partial of ``heads`` heads and
    ``latent`` lanes: a tensor of out's dtype on out's device (any strides), V >= 1. Returns V."""
    if not isinstance(w_uv, torch.Tensor):
        raise TypeError(f"w_uv must be a torch.Tensor W_UV[H, L, V] or None, got "
                        f"{type(w_uv).__name__}")
    if w_uv.dim() != 3:
        raise ValueError(f"w_uv must be 3-D [H, L, V] (per head: latent L -> value V), got "
                         f"shape {tuple(w_uv.shape)}")
    H, L, V = w_uv.shape
    if H != heads or L != latent:
        raise ValueError(f"w_uv has shape {tuple(w_uv.shape)} but out is [B, H={heads}, "
                         f"L={latent}]: w_uv must be [H={heads}, L={latent}, V]")
    if V < 1:
        raise ValueError(f"w_uv has V={V} value lanes: the up-projection needs V >= 1")
    if w_uv.dtype != dtype:
        raise ValueError(f"w_uv has dtype {w_uv.dtype}, expected {dtype} (out's dtype)")
    if w_uv.device != device:
        raise ValueError(f"w_uv is on {w_uv.device} but out is on {device}")
    if w_uv.is_meta:
        raise ValueError("w_uv is a meta tensor: it has no data for the kernels to read")
    return V


def check_seq_values(seq_lens, query_start_loc, num_rows: int) -> None:
    """The values of host (CPU) index tensors, read without a device sync: every KV length
    >= 0, query_start_loc non-decreasing from >= 0 to at most the batch's ``num_rows``.

    CUDA index tensors are not read on the host (it would cost a sync on the decode path);
    there the kernels give every value a meaning: a row's request is the last s with
    query_start_loc[s] <= row (a binary search), a row is masked (LSE -inf) when that request's
    seq_len is <= 0 or the row is before query_start_loc[0] or at or after query_start_loc[-1];
    rows past the batch do not exist."""
    if seq_lens.numel():
        low = int(seq_lens.min())
        if low < 0:
            at = int((seq_lens < 0).nonzero()[0, 0])
            raise ValueError(f"seq_lens[{at}] = {int(seq_lens[at])}: a request's local KV length "
                             "must be >= 0 (0: no KV on this rank)")
    q = query_start_loc
    if q.numel() == 0:
        return
    if int(q[0]) < 0:
        raise ValueError(f"query_start_loc[0] = {int(q[0])}: query rows start at >= 0")
    if q.numel() > 1:
        steps = q[1:] - q[:-1]
        if bool((steps < 0).any()):
            at = int((steps < 0).nonzero()[0, 0])
            raise ValueError(f"query_start_loc must be non-decreasing (cumulative query rows), "
                             f"got {int(q[at])} then {int(q[at + 1])} at entries {at}, {at + 1}")
    if int(q[-1]) > num_rows:
        raise ValueError(f"query_start_loc[-1] = {int(q[-1])} is past the batch of B={num_rows} "
                         "rows: the requests' query rows must end at or before B (rows from "
                         "query_start_loc[-1] on are padding)")
