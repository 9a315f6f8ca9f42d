"""Streams: the eager staging pair is keyed by device, dtype and tag but not by CUDA stream, so calls on two streams share one send/recv pair and one stream's pack overwrites what the other stream's combine is still reading."""

import torch

import dcp_a2a
from dcp_a2a import StagingBuffers
from dcp_a2a.buffers import _overlaps

NEEDS_GPUS = 1  # two CUDA streams: the self-check runs this mutant only where there is a GPU


class _OnePairPerDevice(StagingBuffers):
    """StagingBuffers with the stream left out of the eager key; captures and the overlap
    check stay right, so this is the one bug."""

    def get(self, shape, dtype, device, tag, avoid=()):
        device = torch.device(device)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return super().get(shape, dtype, device, tag, avoid)
        numel = 1
        for s in shape:
            numel *= int(s)
        key = (device, dtype, tag)
        flat = self._eager.get(key)
        if flat is None or flat.numel() < numel:
            flat = torch.empty(numel, dtype=dtype, device=device)
            self._eager[key] = flat
        view = flat[:numel].view(shape)
        if any(_overlaps(view, a) for a in avoid if a is not None):
            return torch.empty(shape, dtype=dtype, device=device)
        return view


_WS = _OnePairPerDevice()
lse_pack_dim, pack_send, unpack_combine = (dcp_a2a.lse_pack_dim, dcp_a2a.pack_send,
                                           dcp_a2a.unpack_combine)


def lse_reduce(out, lse, group, **kw):
    return dcp_a2a.lse_reduce(out, lse, group, buffers=_WS, **kw)
