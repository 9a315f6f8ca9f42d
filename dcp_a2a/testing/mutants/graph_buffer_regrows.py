"""Graph lifetime: one module-level staging workspace that a larger eager call regrows (frees and reallocates), also under capture, so a graph captured at a small batch replays into freed memory."""

import dcp_a2a
from dcp_a2a import StagingBuffers

NEEDS_GPUS = 1  # CUDA graphs: the self-check runs this mutant only where there is a GPU


class _Workspace(StagingBuffers):
    def get(self, shape, dtype, device, tag, avoid=()):
        numel = 1
        for s in shape:
            numel *= int(s)
        key = (str(device), dtype, tag)
        flat = self._eager.get(key)
        if flat is None or flat.numel() < numel:
            import torch

            flat = torch.empty(numel, dtype=dtype, device=device)  # the old block is freed
            self._eager[key] = flat
        return flat[:numel].view(shape)


_WS = _Workspace()
lse_pack_dim, pack_send, unpack_combine = (dcp_a2a.lse_pack_dim, dcp_a2a.pack_send,
                                           dcp_a2a.unpack_combine)


def lse_reduce(out, lse, group, **kw):
    return dcp_a2a.lse_reduce(out, lse, group, buffers=_WS, **kw)
