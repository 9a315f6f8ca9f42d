"""Streams: the eager staging pair is keyed by device, dtype and tag but not by CUDA stream, so calls on two streams share one send/recv pair and one stream's pack overwrites what the other stream's combine is still reading."""

import dcp_a2a
from dcp_a2a import StagingBuffers

NEEDS_GPUS = 1  # two CUDA streams: the self-check runs this mutant only where there is a GPU


class _OnePairPerDevice(StagingBuffers):
    """StagingBuffers with the stream left out of the eager key; captures and the overlap
    check stay right, so this is the one bug."""

    def _eager_key(self, device, dtype, tag):
        return (device, dtype, tag)


_WS = _OnePairPerDevice()
lse_pack_dim, pack_send, unpack_combine = (dcp_a2a.lse_pack_dim, dcp_a2a.pack_send,
                                           dcp_a2a.unpack_combine)


def lse_reduce(out, lse, group, **kw):
    return dcp_a2a.lse_reduce(out, lse, group, buffers=_WS, **kw)
