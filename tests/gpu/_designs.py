"""Staging-buffer designs that shipped elsewhere, for the incident tests to show they catch what
they claim to catch and nothing more. Each is a drop-in for dcp_a2a.StagingBuffers."""

from __future__ import annotations

import torch

from dcp_a2a import StagingBuffers


class GrowableWorkspace(StagingBuffers):
    """Incidents 1 and 2 (broken): one shared growable workspace per tag, handed out during
    capture as well; a larger call regrows it and frees, to the eager allocator, the block a
    captured graph still writes on every replay."""

    def get(self, shape, dtype, device, tag, avoid=()):
        numel = 1
        for s in shape:
            numel *= int(s)
        key = (torch.device(device), dtype, tag)
        flat = self._eager.get(key)
        if flat is None or flat.numel() < numel:
            flat = torch.empty(numel, dtype=dtype, device=device)
            self._eager[key] = flat
        return flat[:numel].view(shape)


class PerCallAllocation(StagingBuffers):
    """Legal: a fresh tensor per call, released when the call returns (vLLM's packed path).
    Under captures sharing one pool the pool may give the memory to a later capture, which is
    safe under PyTorch's rule for shared pools (a graph's output is read after its own replay,
    before another graph of the pool replays)."""

    def get(self, shape, dtype, device, tag, avoid=()):
        return torch.empty(shape, dtype=dtype, device=device)


class CarvedWorkspace(StagingBuffers):
    """Incident 3: the staging buffer carved from the workspace region that also holds the
    caller's attention output (it ignores what it must avoid)."""

    def __init__(self, workspace: torch.Tensor):
        super().__init__()
        self.workspace = workspace

    def get(self, shape, dtype, device, tag, avoid=()):
        numel = 1
        for s in shape:
            numel *= int(s)
        return self.workspace.view(dtype)[:numel].view(shape)
