"""Graph lifetime at N >= 2 only: the send/recv staging of a real exchange lives in module-level buffers that a larger call reallocates (the old block freed, also under capture), while a group of one takes a correct path (as engines pass it straight through), so a graph captured before the regrow replays into freed memory and no group-of-one test can see it."""

import dcp_a2a
from dcp_a2a import StagingBuffers

from ._regrowing import RegrowingWorkspace

NEEDS_GPUS = 1  # CUDA graphs: the self-check runs this mutant only where there is a GPU

_MULTI_RANK = RegrowingWorkspace()
_ONE_RANK = StagingBuffers()
lse_pack_dim, pack_send, unpack_combine = (dcp_a2a.lse_pack_dim, dcp_a2a.pack_send,
                                           dcp_a2a.unpack_combine)


def lse_reduce(out, lse, group, **kw):
    bufs = _ONE_RANK if getattr(group, "world_size", 1) == 1 else _MULTI_RANK
    return dcp_a2a.lse_reduce(out, lse, group, buffers=bufs, **kw)
