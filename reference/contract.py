"""The dcp_a2a contract in pure PyTorch: a second, independent, correct implementation.

Use it as the implementation under test (``pytest -m conformance --impl
dcp_a2a.reference.contract``), as a CPU fallback, or as the base of an adapter. It never imports
``dcp_a2a``.

    lse_pack_dim(dtype) -> int
    pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None) -> None
    unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e, into=None)
    lse_reduce(out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
               seq_lens=None, query_start_loc=None, into=None, w_uv=None)

Shapes and dtypes: ``out[B, H, D]`` float16/bfloat16/float32 (any strides), ``lse[B, H]``
float32/bfloat16/float16; the wire buffer ``[N, B, H/N, D + P]`` in out's dtype (see
:mod:`reference.wire`); results ``[B, H/N, D]`` in out's dtype and ``[B, H/N]`` float32.
The merge is evaluated in float64 (:mod:`reference.combine`) and rounded once to the output
dtype. ``into``: the caller's result buffer (written, and returned in the result's place).
``w_uv[H, L, V]``: MLA's up-projection, after the merge (the exchange carries the latent; the
merged latent, rounded to the output dtype, is projected by this rank's heads of W in float64
and rounded once more). ``lse_reduce`` runs one ``torch.distributed.all_to_all_single`` on
``group.device_group``; a group of one is a pass-through that touches no process group.

Every step is a method of :class:`ReferenceContract`, so a variant (an engine adapter, or a
deliberately broken mutant in ``dcp_a2a/testing/mutants/``) overrides one step and keeps the
rest. Bad input raises ``ValueError``/``TypeError`` naming the problem before any collective.

Every call allocates its temporaries (the send and receive buffers, the float64 sums) and lets
them go, as ordinary PyTorch code does, under CUDA graph capture too: memory a capture frees
goes back to the graph's pool, which is safe under PyTorch's rule for graphs sharing a pool
(each graph's output is read after its own replay, before another graph of the pool replays).
The conformance tier's graphs clause holds implementations to that rule and no stricter one.
"""

from __future__ import annotations

import math

import torch

from .combine import sanitize_lse
from . import wire
from .wire import row_mask

OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LSE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
_INT_OF_WIDTH = {2: torch.int16, 4: torch.int32}


# ----------------------------------------------------------------------------- validation
def _tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _int(name, v, minimum):
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def _bool(name, v):
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")


def _one_device(**tensors):
    devs = {k: t.device for k, t in tensors.items() if t is not None}
    if len(set(devs.values())) > 1:
        raise ValueError("tensors must be on one device, got "
                         + ", ".join(f"{k} on {d}" for k, d in devs.items()))


def _byte_span(t):
    if t.numel() == 0:
        return (0, 0)
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
    return (t.data_ptr(), t.data_ptr() + extent * t.element_size())


def _disjoint(dst_name, dst, **srcs):
    """A staging buffer that overlaps the tensors it is packed from would overwrite them."""
    if dst.numel() == 0 or dst.device.type == "meta":
        return
    d0, d1 = _byte_span(dst)
    for name, src in srcs.items():
        if src is None or src.numel() == 0 or src.device != dst.device:
            continue
        s0, s1 = _byte_span(src)
        if d0 < s1 and s0 < d1:
            raise ValueError(f"{dst_name} overlaps {name} in memory: a staging buffer must not "
                             "alias the tensors it is built from")


class ReferenceContract:
    """The contract as overridable steps. Module-level functions are bound to one instance."""

    # ------------------------------------------------------------------- the wire format
    def lse_pack_dim(self, dtype: torch.dtype) -> int:
        """2 for float16/bfloat16, 1 for float32; ValueError naming any other dtype."""
        return wire.lse_pack_dim(dtype)

    def lse_to_fp32(self, lse: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """The LSE as float32 (exact for bf16/fp16 inputs); never rounded to ``out_dtype``."""
        return lse.to(torch.float32)

    def peer_major(self, x: torch.Tensor, world_size: int, h_per_rank: int) -> torch.Tensor:
        """``x[B, H, ...]`` as ``[N, B, H/N, ...]``: slice r holds heads [r*H/N, (r+1)*H/N)."""
        return x.unflatten(1, (world_size, h_per_rank)).transpose(0, 1)

    def lse_to_lanes(self, lse32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """float32 ``lse32[...]`` -> its bits as integer lanes ``[..., P]`` of ``dtype``'s width:
        one int32 lane, or two int16 lanes (low 16 bits first, then the high 16 bits)."""
        bits = lse32.contiguous().view(torch.int32)
        if self.lse_pack_dim(dtype) == 1:
            return bits.unsqueeze(-1)
        lo = bits & 0xFFFF
        hi = (bits >> 16) & 0xFFFF
        halves = torch.stack([lo, hi], dim=-1)
        return torch.where(halves >= 0x8000, halves - 0x10000, halves).to(torch.int16)

    def lanes_to_lse(self, lanes: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`lse_to_lanes`: integer lanes ``[..., P]`` -> float32 ``[...]``."""
        if lanes.shape[-1] == 1:
            return lanes[..., 0].contiguous().view(torch.float32)
        lo = lanes[..., 0].to(torch.int32) & 0xFFFF
        hi = lanes[..., 1].to(torch.int32) << 16
        return (hi | lo).view(torch.float32)

    def empty_rows(self, num_rows, seq_lens, query_start_loc, device) -> torch.Tensor:
        """Bool [B]: rows of requests with no local KV, and padding rows."""
        return row_mask(num_rows, seq_lens, query_start_loc, device)

    # ------------------------------------------------------------------- the merge
    def merge_weights(self, lses: torch.Tensor, is_lse_base_on_e: bool):
        """float64 normalised weights ``w[N, B, H']`` and merged LSE ``g[B, H']``.

        Shift by the row max (no overflow for any spread); NaN/+inf count as -inf; an all -inf
        row gets weights 0 and g = -inf."""
        s = sanitize_lse(lses)
        m = s.amax(dim=0)
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = torch.exp(s - m_safe) if is_lse_base_on_e else torch.exp2(s - m_safe)
        total = e.sum(dim=0)
        safe_total = torch.where(total > 0, total, torch.ones_like(total))
        w = torch.where(total > 0, e / safe_total, torch.zeros_like(e))
        log = torch.log if is_lse_base_on_e else torch.log2
        g = torch.where(total > 0, m_safe + log(safe_total), torch.full_like(m, -math.inf))
        return w, g

    def weighted_sum(self, w: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
        """sum_n w_n * data_n in float64; a zero weight contributes exactly nothing (not
        0 * NaN)."""
        x = data.to(torch.float64)
        wx = w[..., None] * x
        return torch.where(w[..., None] > 0, wx, torch.zeros_like(wx)).sum(dim=0)

    def round_output(self, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """float64 -> the output dtype, round to nearest even (fp16/bf16 through float32; the
        double rounding is far below the error bound's fp32 term)."""
        return y.to(dtype)

    # ------------------------------------------------------------------- the exchange
    def staging(self, shape, dtype, device) -> torch.Tensor:
        """A fresh send buffer: its own allocation, never a view of the caller's tensors."""
        return torch.empty(shape, dtype=dtype, device=device)

    def exchange(self, send: torch.Tensor, group) -> torch.Tensor:
        """``recv[src] = send_of_rank_src[me]``: one all_to_all_single on the device group."""
        if group.world_size == 1:
            return send
        import torch.distributed as dist

        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group.device_group)
        return recv

    # ------------------------------------------------------------------- checks
    def check_out_lse(self, out, lse):
        _tensor("out", out)
        _tensor("lse", lse)
        self.lse_pack_dim(out.dtype)
        if out.dim() != 3:
            raise ValueError(f"out must be 3-D [B, H, D], got shape {tuple(out.shape)}")
        if lse.dim() != 2:
            raise ValueError(f"lse must be 2-D [B, H], got shape {tuple(lse.shape)}")
        if lse.dtype not in LSE_DTYPES:
            raise ValueError(f"unsupported lse dtype {lse.dtype}: expected float32, bfloat16 "
                             "or float16")
        if tuple(lse.shape) != tuple(out.shape[:2]):
            raise ValueError(f"out/lse shape mismatch: out is {tuple(out.shape)} so lse must be "
                             f"{tuple(out.shape[:2])}, got {tuple(lse.shape)}")
        _one_device(out=out, lse=lse)
        if out.shape[2] < 1:
            raise ValueError(f"head_dim must be >= 1, got {out.shape[2]}")
        return tuple(out.shape)

    def check_heads(self, num_heads, world_size):
        _int("world_size", world_size, 1)
        if num_heads % world_size:
            raise ValueError(f"number of heads H={num_heads} is not divisible by the DCP world "
                             f"size N={world_size}")
        return num_heads // world_size

    def check_seq_meta(self, seq_lens, query_start_loc, device):
        if (seq_lens is None) != (query_start_loc is None):
            given, missing = (("seq_lens", "query_start_loc") if seq_lens is not None
                              else ("query_start_loc", "seq_lens"))
            raise ValueError(f"{given} was given without {missing}: pass both or neither")
        if seq_lens is None:
            return
        for name, t in (("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
            _tensor(name, t)
            if t.dtype not in INDEX_DTYPES:
                raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
            if t.dim() != 1:
                raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
            if t.device != device:
                raise ValueError(f"{name} is on {t.device} but the attention output is on "
                                 f"{device}")
        if query_start_loc.numel() != seq_lens.numel() + 1:
            raise ValueError("query_start_loc must have len(seq_lens) + 1 entries, got "
                             f"{query_start_loc.numel()} for {seq_lens.numel()} sequences")

    def check_wire(self, name, buf, head_dim, lse_pack_dim, dtype=None, shape=None):
        _tensor(name, buf)
        p = self.lse_pack_dim(buf.dtype)
        if dtype is not None and buf.dtype != dtype:
            raise ValueError(f"{name} dtype {buf.dtype} does not match the output dtype {dtype}")
        if lse_pack_dim != p:
            raise ValueError(f"lse_pack_dim={lse_pack_dim} does not match {name} dtype "
                             f"{buf.dtype} (expected {p})")
        if buf.dim() != 4:
            raise ValueError(f"{name} must be 4-D [N, B, H/N, D+P], got shape "
                             f"{tuple(buf.shape)}")
        if buf.shape[3] != head_dim + p:
            raise ValueError(f"{name} last dim is {buf.shape[3]} but head_dim={head_dim} + "
                             f"lse_pack_dim={p} = {head_dim + p}")
        if shape is not None and tuple(buf.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(buf.shape)}, expected {tuple(shape)}")
        return tuple(buf.shape[:3])

    def check_group(self, group):
        for attr in ("world_size", "rank_in_group", "device_group"):
            if not hasattr(group, attr):
                raise TypeError(f"group must have world_size, rank_in_group and device_group; "
                                f"{type(group).__name__} has no {attr}")
        n = _int("group.world_size", group.world_size, 1)
        r = _int("group.rank_in_group", group.rank_in_group, 0)
        if r >= n:
            raise ValueError(f"group.rank_in_group={r} is not below world_size={n}")
        pg = group.device_group
        if n > 1 and hasattr(pg, "size") and hasattr(pg, "rank"):  # a ProcessGroup: ask it
            if pg.size() != n:
                raise ValueError(f"group.device_group has {pg.size()} ranks but "
                                 f"group.world_size={n}")
            if pg.rank() != r:
                raise ValueError(f"group.rank_in_group={r} but this process is rank "
                                 f"{pg.rank()} of group.device_group")
        return n, r

    def check_into(self, into, shape, dtype, device, **reads):
        """The caller's result buffer: a tensor of ``shape``, ``dtype`` and ``device`` (any
        strides, one address per element, no grad), overlapping nothing in ``reads``."""
        if not isinstance(into, torch.Tensor):
            raise TypeError(f"into must be a torch.Tensor or None, got {type(into).__name__}")
        if tuple(into.shape) != tuple(shape):
            raise ValueError(f"into has shape {tuple(into.shape)}, expected {tuple(shape)}")
        if into.dtype != dtype:
            raise ValueError(f"into has dtype {into.dtype}, expected {dtype}")
        if into.device != device:
            raise ValueError(f"into is on {into.device}, expected {device}")
        if into.requires_grad:
            raise ValueError("into requires grad: the result is written without autograd")
        if into.numel() > 1 and torch._debug_has_internal_overlap(into) == 1:
            raise ValueError(f"into has strides {into.stride()} that put several elements at "
                             "one address")
        _disjoint("into", into, **reads)

    def check_w_uv(self, w_uv, heads, latent, dtype, device):
        """W_UV[H, L, V] for a latent partial of ``heads`` heads and ``latent`` lanes."""
        _tensor("w_uv", w_uv)
        if w_uv.dim() != 3 or w_uv.shape[0] != heads or w_uv.shape[1] != latent:
            raise ValueError(f"w_uv must be [H={heads}, L={latent}, V], got shape "
                             f"{tuple(w_uv.shape)}")
        if w_uv.shape[2] < 1:
            raise ValueError("w_uv has V=0 value lanes: the up-projection needs V >= 1")
        if w_uv.dtype != dtype:
            raise ValueError(f"w_uv has dtype {w_uv.dtype}, expected {dtype} (out's dtype)")
        if w_uv.device != device:
            raise ValueError(f"w_uv is on {w_uv.device} but out is on {device}")
        if w_uv.device.type == "meta":
            raise ValueError("w_uv is a meta tensor: it has no data")
        return w_uv.shape[2]

    def project(self, latent, w):
        """latent[B, H', L] @ w[H', L, V] per head in float64, rounded once to latent's dtype."""
        return torch.einsum("bhl,hlv->bhv", latent.to(torch.float64),
                            w.to(torch.float64)).to(latent.dtype)

    # ------------------------------------------------------------------- the contract
    def pack_send(self, out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                  seq_lens=None, query_start_loc=None) -> None:
        """Write ``send[N, B, H/N, D+P]`` from ``out[B, H, D]`` and ``lse[B, H]``; rows masked
        by ``seq_lens``/``query_start_loc`` go out with LSE -inf."""
        B, H, D = self.check_out_lse(out, lse)
        hpr = self.check_heads(H, world_size)
        _int("h_per_rank", h_per_rank, 0)
        if h_per_rank != hpr:
            raise ValueError(f"h_per_rank={h_per_rank} but H/N = {H}/{world_size} = {hpr}")
        _int("head_dim", head_dim, 1)
        if head_dim != D:
            raise ValueError(f"head_dim={head_dim} does not match out's last dim {D}")
        p = self.lse_pack_dim(out.dtype)
        if lse_pack_dim != p:
            raise ValueError(f"lse_pack_dim={lse_pack_dim} does not match {out.dtype} "
                             f"(expected {p})")
        self.check_wire("send", send, D, p, dtype=out.dtype, shape=(world_size, B, hpr, D + p))
        _one_device(out=out, lse=lse, send=send)
        self.check_seq_meta(seq_lens, query_start_loc, out.device)
        if not send.is_contiguous():
            raise ValueError("send must be contiguous (it is the wire buffer of a collective)")
        _disjoint("send", send, out=out, lse=lse)
        if B == 0 or H == 0:
            return
        self._pack(out, lse, send, world_size, hpr, D, seq_lens, query_start_loc)

    def _pack(self, out, lse, send, world_size, hpr, D, seq_lens, query_start_loc):
        send[..., :D].copy_(self.peer_major(out, world_size, hpr))
        lse32 = self.lse_to_fp32(lse, out.dtype)
        empty = self.empty_rows(out.shape[0], seq_lens, query_start_loc, out.device)
        lse32 = lse32.masked_fill(empty[:, None], -math.inf)
        lanes = self.lse_to_lanes(self.peer_major(lse32, world_size, hpr), send.dtype)
        send.view(_INT_OF_WIDTH[send.element_size()])[..., D:].copy_(lanes)

    def unpack_combine(self, recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e,
                       into=None):
        """Merge ``recv[N, B, H/N, D+P]``: ``out[B, H/N, D]`` in recv's dtype, and with
        ``return_lse`` also ``lse[B, H/N]`` float32 (base 2 when not ``is_lse_base_on_e``);
        ``out`` is ``into`` when given (written there)."""
        self.check_unpack(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)
        if into is not None:
            self.check_into(into, (recv.shape[1], recv.shape[2], head_dim), recv.dtype,
                            recv.device, recv=recv)
        res = self._combine(recv, head_dim, return_lse, is_lse_base_on_e)
        return res if into is None else self._into(res, into, return_lse)

    def _into(self, res, into, return_lse):
        out, lse = res if return_lse else (res, None)
        into.copy_(out)
        return (into, lse) if return_lse else into

    def check_unpack(self, recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
        _int("head_dim", head_dim, 1)
        _bool("return_lse", return_lse)
        _bool("is_lse_base_on_e", is_lse_base_on_e)
        N, _, _ = self.check_wire("recv", recv, head_dim, lse_pack_dim)
        if N < 1:
            raise ValueError("recv must hold at least one peer slice (N >= 1)")

    def _combine(self, recv, head_dim, return_lse, is_lse_base_on_e):
        lanes = recv.view(_INT_OF_WIDTH[recv.element_size()])[..., head_dim:]
        lses = self.lanes_to_lse(lanes)
        w, g = self.merge_weights(lses, is_lse_base_on_e)
        out = self.round_output(self.weighted_sum(w, recv[..., :head_dim]), recv.dtype)
        return (out, g.to(torch.float32)) if return_lse else out

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None, into=None, w_uv=None):
        """Merge this rank's partial with its peers': ``out[B, H/N, D]`` for heads
        [r*H/N, (r+1)*H/N) (and the float32 merged LSE with ``return_lse``); with ``w_uv``
        the merged latent projected by those heads' W, ``[B, H/N, V]``; in ``into`` when
        given."""
        n, r = self.check_group(group)
        _bool("return_lse", return_lse)
        _bool("is_lse_base_on_e", is_lse_base_on_e)
        B, H, D = self.check_out_lse(out, lse)
        hpr = self.check_heads(H, n)
        self.check_seq_meta(seq_lens, query_start_loc, out.device)
        width = D if w_uv is None else self.check_w_uv(w_uv, H, D, out.dtype, out.device)
        if into is not None:
            self.check_into(into, (B, hpr, width), out.dtype, out.device, out=out, lse=lse,
                            seq_lens=seq_lens, query_start_loc=query_start_loc, w_uv=w_uv)
        p = self.lse_pack_dim(out.dtype)
        send = self.staging((n, B, hpr, D + p), out.dtype, out.device)
        self.pack_send(out, lse, send, n, hpr, D, p, seq_lens=seq_lens,
                       query_start_loc=query_start_loc)
        recv = self.exchange(send, group)
        res = self.unpack_combine(recv, D, p, return_lse, is_lse_base_on_e)
        if w_uv is not None:
            latent, g = res if return_lse else (res, None)
            projected = self.project(latent, w_uv[r * hpr:(r + 1) * hpr])
            res = (projected, g) if return_lse else projected
        return res if into is None else self._into(res, into, return_lse)

    def functions(self):
        """(lse_pack_dim, pack_send, unpack_combine, lse_reduce) bound to this instance."""
        return self.lse_pack_dim, self.pack_send, self.unpack_combine, self.lse_reduce


IMPL = ReferenceContract()
lse_pack_dim, pack_send, unpack_combine, lse_reduce = IMPL.functions()

__all__ = ["IMPL", "ReferenceContract", "lse_pack_dim", "lse_reduce", "pack_send",
           "unpack_combine"]
