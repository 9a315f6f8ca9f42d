"""Staging buffers for the exchange, and the rules that keep them valid under CUDA graphs.

Three ways engines broke this feature, and the rule here that rules each one out:

1. A shared, growable workspace handed out the send/recv buffers; a CUDA graph captured their
   addresses; a later eager call with a larger batch regrew the workspace and freed the block the
   graph still wrote to (illegal memory access on replay).
   -> Buffers handed out while a stream is capturing are never part of the eager cache: each
      capture gets its own buffers, and this owner keeps a reference to them for its whole
      lifetime. Eager growth only ever replaces eager buffers.
2. Several graphs (one per batch size) were captured from one shared memory pool; a staging
   tensor allocated during one capture was freed after it, and the pool handed the same address
   to the next capture (garbled output on replay).
   -> Same rule: captured buffers are pinned by this owner, so the pool can never recycle them.
3. The staging buffer was carved from the workspace region that also held the attention output
   being packed, so the pack kernel overwrote its own input.
   -> Buffers come from their own allocations, never from a caller's workspace, and
      ``pack_send`` refuses a send buffer that overlaps its inputs.

Eager calls reuse one grow-only pair per (device, dtype, tag): the hot path allocates nothing
once the largest shape has been seen. Reuse is safe because every consumer of a receive buffer
(the combine kernel) runs on the same stream before the next call can write it.
"""

from __future__ import annotations

import threading

import torch


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class StagingBuffers:
    """Owner of the send/recv pairs used by ``lse_reduce``. One per process (or per engine)."""

    def __init__(self) -> None:
        self._eager: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._lock = threading.Lock()

    def wire_pair(self, shape, dtype: torch.dtype, device, tag: str = "wire"):
        """A (send, recv) pair of ``shape``; contiguous, disjoint, not aliasing any caller data."""
        device = torch.device(device)
        numel = 1
        for s in shape:
            numel *= int(s)
        if _capturing(device):
            pair = (torch.empty(shape, dtype=dtype, device=device),
                    torch.empty(shape, dtype=dtype, device=device))
            with self._lock:
                self._captured.append(pair)
            return pair
        key = (device, dtype, tag)
        with self._lock:
            flat = self._eager.get(key)
            if flat is None or flat[0].numel() < numel:
                flat = (torch.empty(numel, dtype=dtype, device=device),
                        torch.empty(numel, dtype=dtype, device=device))
                self._eager[key] = flat
        return flat[0][:numel].view(shape), flat[1][:numel].view(shape)

    @property
    def captured_pairs(self) -> int:
        return len(self._captured)

    def release_captured(self) -> None:
        """Drop the buffers pinned for captured graphs. Only call once those graphs are gone."""
        with self._lock:
            self._captured.clear()


_default: StagingBuffers | None = None


def default_buffers() -> StagingBuffers:
    global _default
    if _default is None:
        _default = StagingBuffers()
    return _default
