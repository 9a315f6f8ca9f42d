"""Receive buffers for ``lse_reduce(backend="symm_mem")``: the direct exchange over symmetric
memory (no NCCL on the decode path).

Each rank allocates, once, a receive buffer of two wire slots and N int64 flags in torch's
symmetric memory, and learns its peers' addresses of both (``rendezvous``). The pack kernel
then stores every slice straight into its owner's buffer and signals it; the combine kernel
waits for the N signals and merges from its own buffer (protocol: :mod:`dcp_a2a.kernels.direct`).

Rules, as for :class:`dcp_a2a.StagingBuffers`:

* Sized once, for ``max_tokens`` token rows of one (num_heads, head_dim, dtype); a call with
  more rows is a ValueError naming both numbers (symmetric memory cannot regrow under a
  captured graph, and every rank would have to regrow together).
* Its own allocations: they never alias a caller's tensors, and nothing is allocated per call
  except the returned output, so CUDA graphs may capture calls at any batch size up to the
  maximum and replay them in any order.
* NVLink multicast is never used (plain peer pointers only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .buffers import _as_device
from .wire import BITS_DTYPE, check_group, check_head_split, lse_pack_dim, require_int


@dataclass
class PeerTables:
    """What the direct kernels read and write on one rank (see :mod:`dcp_a2a.kernels.direct`).

    ``recv``: this rank's buffer ``[2 * N * max_tokens * H/N * (D+P)]`` in the output dtype;
    ``flags``: this rank's int64 ``[N]``; ``peer_recv_ptrs`` / ``peer_flag_ptrs``: int64
    ``[N]`` device tensors of every rank's ``recv`` / ``flags`` address (this rank's included);
    ``counter`` int32 ``[1]`` and ``epoch`` int64 ``[1]``: local state, zero at creation.
    """

    world_size: int
    rank: int
    max_tokens: int
    num_heads: int
    head_dim: int
    dtype: torch.dtype
    recv: torch.Tensor
    flags: torch.Tensor
    peer_recv_ptrs: torch.Tensor
    peer_flag_ptrs: torch.Tensor
    counter: torch.Tensor
    epoch: torch.Tensor

    @property
    def h_per_rank(self) -> int:
        return self.num_heads // self.world_size

    @property
    def lse_lanes(self) -> int:
        return lse_pack_dim(self.dtype)

    @property
    def bits_dtype(self) -> torch.dtype:
        return BITS_DTYPE[self.dtype]

    @property
    def device(self) -> torch.device:
        return self.recv.device

    def recv_lanes(self, paired: bool) -> torch.Tensor:
        """The receive buffer in the units the pack kernel moves (int32 words when paired)."""
        return self.recv.view(torch.int32 if paired else self.bits_dtype)

    def slot_view(self, slot: int, batch: int) -> torch.Tensor:
        """Slot ``slot`` holding a call of ``batch`` rows, as the wire buffer [N, B, H/N, D+P]."""
        n, w = self.world_size, self.head_dim + self.lse_lanes
        per_slot = self.recv.numel() // 2
        size = n * batch * self.h_per_rank * w
        return self.recv[slot * per_slot: slot * per_slot + size].view(
            n, batch, self.h_per_rank, w)


def _sizes(world_size, max_tokens, num_heads, head_dim, dtype) -> int:
    """Checked arguments -> elements of one slot."""
    p = lse_pack_dim(dtype)
    require_int("max_tokens", max_tokens, 1)
    require_int("num_heads", num_heads, 1)
    require_int("head_dim", head_dim, 1)
    hpr = check_head_split(num_heads, world_size)
    return world_size * max_tokens * hpr * (head_dim + p)


def _tables(world_size, rank, max_tokens, num_heads, head_dim, dtype, recv, flags, recv_ptrs,
            flag_ptrs) -> PeerTables:
    dev = recv.device
    return PeerTables(
        world_size, rank, max_tokens, num_heads, head_dim, dtype, recv, flags,
        torch.tensor(recv_ptrs, dtype=torch.int64, device=dev),
        torch.tensor(flag_ptrs, dtype=torch.int64, device=dev),
        torch.zeros(1, dtype=torch.int32, device=dev),
        torch.zeros(1, dtype=torch.int64, device=dev),
    )


def _require_room(elements: int, dtype: torch.dtype, device: torch.device) -> None:
    """ValueError where the buffers could never fit the device's memory (a max_tokens of
    2^50), instead of the allocator's error after the collective rendezvous has begun."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    need = elements * torch.empty((), dtype=dtype).element_size()
    if need > total:
        raise ValueError(f"SymmMemBuffers need {need / 2**30:.1f} GiB per rank (2 slots of "
                         f"max_tokens x num_heads x (head_dim + P)) but {device} has "
                         f"{total / 2**30:.1f} GiB: lower max_tokens")


def _require_symmetric_memory(group, device) -> None:
    """The reasons this machine or group cannot run the backend, as one ValueError."""
    import torch.distributed as dist

    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(
            f"backend='symm_mem' needs CUDA devices (peer-to-peer stores between GPUs); got "
            f"device {device}. On CPU (and with gloo) use backend='packed'")
    if group.world_size > 1:
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("backend='symm_mem' with world_size > 1 needs torch.distributed: "
                             "call torch.distributed.init_process_group first")
        backend = dist.get_backend(group.device_group)
        if backend != "nccl":
            raise ValueError(
                f"backend='symm_mem' needs a group of CUDA ranks (an NCCL process group); "
                f"this group's backend is {backend!r}: use backend='packed' with it")
        try:
            from torch.distributed import _symmetric_memory  # noqa: F401
        except ImportError as e:  # pragma: no cover - torch builds without it
            raise ValueError(f"backend='symm_mem' needs torch symmetric memory: {e}") from e


class SymmMemBuffers:
    """The receive buffers of ``lse_reduce(..., backend="symm_mem", buffers=...)`` for one
    DCP group. Create it on every rank of the group, in the same order as other symmetric
    memory (it is a collective: it allocates and exchanges addresses), before any CUDA graph
    capture; then pass it to every call.

    ``SymmMemBuffers(group, max_tokens=B_max, num_heads=H, head_dim=D, dtype=torch.bfloat16)``
    ``group``: the same object ``lse_reduce`` gets (``world_size``, ``rank_in_group``,
    ``device_group``); ``device``: default the current CUDA device.
    Memory per rank: ``2 * B_max * H * (D + P)`` elements plus N flags.
    """

    def __init__(self, group, *, max_tokens: int, num_heads: int, head_dim: int,
                 dtype: torch.dtype, device=None) -> None:
        n, r = check_group(group)  # first: None or a bare object is a TypeError, as in lse_reduce
        device = _as_device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
            else torch.device("cpu"))
        per_slot = _sizes(n, max_tokens, num_heads, head_dim, dtype)
        _require_symmetric_memory(group, device)
        _require_room(2 * per_slot, dtype, device)
        self.group = group
        if n == 1:
            recv = torch.empty(2 * per_slot, dtype=dtype, device=device)
            flags = torch.zeros(1, dtype=torch.int64, device=device)
            self.tables = _tables(1, 0, max_tokens, num_heads, head_dim, dtype, recv, flags,
                                  [recv.data_ptr()], [flags.data_ptr()])
            return
        import torch.distributed._symmetric_memory as symm

        pg = group.device_group
        name = getattr(pg, "group_name", pg)
        recv = symm.empty(2 * per_slot, dtype=dtype, device=device)
        flags = symm.empty(n, dtype=torch.int64, device=device)
        flags.zero_()
        # every rank's flags are zero before any peer can signal into them: rendezvous is a
        # collective over the store, entered after this rank's zeroing has finished
        torch.cuda.synchronize(device)
        h_recv = symm.rendezvous(recv, name)
        h_flags = symm.rendezvous(flags, name)
        self._handles = (h_recv, h_flags)  # keep the peer mappings alive
        self.tables = _tables(n, r, max_tokens, num_heads, head_dim, dtype, recv, flags,
                              list(h_recv.buffer_ptrs), list(h_flags.buffer_ptrs))

    @classmethod
    def in_process(cls, world_size: int, *, max_tokens: int, num_heads: int, head_dim: int,
                   dtype: torch.dtype, device) -> list["SymmMemBuffers"]:
        """N ranks' buffers in one process on one device (plain memory, each rank's tables
        pointing at the others'): the direct kernels' own arithmetic and layout, run by
        :func:`dcp_a2a.inprocess.lse_reduce_in_process` on a GPU or through Triton's
        interpreter."""
        n = require_int("world_size", world_size, 1)
        per_slot = _sizes(n, max_tokens, num_heads, head_dim, dtype)
        device = _as_device(device)
        _require_room(2 * per_slot * n, dtype, device)
        recvs = [torch.empty(2 * per_slot, dtype=dtype, device=device) for _ in range(n)]
        flags = [torch.zeros(n, dtype=torch.int64, device=device) for _ in range(n)]
        out = []
        for r in range(n):
            b = cls.__new__(cls)
            b.group = None
            b.tables = _tables(n, r, max_tokens, num_heads, head_dim, dtype, recvs[r],
                               flags[r], [t.data_ptr() for t in recvs],
                               [t.data_ptr() for t in flags])
            b._handles = (recvs, flags)
            out.append(b)
        return out

    def check_call(self, out: torch.Tensor, world_size: int, rank: int,
                   head_dim: int | None = None) -> None:
        """ValueError unless a call with ``out[B, H, D]`` fits these buffers (``head_dim``: the
        width the exchange carries when it is not D, the up-projected V)."""
        t = self.tables
        B, H, D = out.shape
        if head_dim is not None:
            D = head_dim
        if (world_size, rank) != (t.world_size, t.rank):
            raise ValueError(
                f"these SymmMemBuffers were made for rank {t.rank} of {t.world_size}, but the "
                f"call is rank {rank} of {world_size}")
        if out.dtype != t.dtype or (H and H != t.num_heads) or D != t.head_dim:
            raise ValueError(
                f"these SymmMemBuffers hold num_heads={t.num_heads}, head_dim={t.head_dim}, "
                f"{t.dtype}; the call has H={H}, D={D}, {out.dtype}")
        if B > t.max_tokens:
            raise ValueError(
                f"the call has B={B} token rows but these SymmMemBuffers were created for "
                f"max_tokens={t.max_tokens}: create them with max_tokens >= {B}")
        if out.device != t.device:
            raise ValueError(f"out is on {out.device} but these SymmMemBuffers are on "
                             f"{t.device}")
