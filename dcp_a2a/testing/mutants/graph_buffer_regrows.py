"""Graph lifetime: one module-level staging workspace that a larger eager call regrows (frees and reallocates), also under capture, so a graph captured at a small batch replays into freed memory."""

import dcp_a2a

from ._regrowing import RegrowingWorkspace

NEEDS_GPUS = 1  # CUDA graphs: the self-check runs this mutant only where there is a GPU

_WS = RegrowingWorkspace()
lse_pack_dim, pack_send, unpack_combine = (dcp_a2a.lse_pack_dim, dcp_a2a.pack_send,
                                           dcp_a2a.unpack_combine)


def lse_reduce(out, lse, group, **kw):
    return dcp_a2a.lse_reduce(out, lse, group, buffers=_WS, **kw)
