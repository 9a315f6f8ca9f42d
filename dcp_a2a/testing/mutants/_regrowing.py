"""Helper of two mutants (not a mutant itself): staging that grows by reallocation."""

import torch

from dcp_a2a import StagingBuffers


class RegrowingWorkspace(StagingBuffers):
    """One buffer per eager key (device, stream, dtype, tag), handed out during captures too and
    replaced by a larger one when a call needs more: the old block goes back to the allocator
    while a graph captured with it still writes it on every replay. Everything else as the
    project's StagingBuffers."""

    def get(self, shape, dtype, device, tag, avoid=()):
        numel = 1
        for s in shape:
            numel *= int(s)
        device = torch.device(device)
        key = self._eager_key(device, dtype, tag)
        flat = self._eager.get(key)
        if flat is None or flat.numel() < numel:
            flat = torch.empty(numel, dtype=dtype, device=device)  # the old block is freed
            self._eager[key] = flat
        return flat[:numel].view(shape)
