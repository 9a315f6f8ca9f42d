"""Caller buffer aliasing: into= is never checked against what the call reads, so a buffer that overlaps the received wire (or the partials) is accepted and the combine overwrites rows it has yet to read."""

from dcp_a2a import collective as _collective
from dcp_a2a import ops as _ops

# Process-wide patch, as in overlap_check_one_way (a mutant's session tests only the mutant).
if not (callable(getattr(_ops, "require_disjoint", None))
        and callable(getattr(_collective, "require_disjoint", None))):
    raise ImportError("dcp_a2a.ops / dcp_a2a.collective require_disjoint not found: update "
                      "this mutant")
_real = _ops.require_disjoint


def _into_unchecked(dst_name, dst, **sources):
    if dst_name == "into":
        return None
    return _real(dst_name, dst, **sources)


_ops.require_disjoint = _into_unchecked
_collective.require_disjoint = _into_unchecked

import dcp_a2a  # noqa: E402

lse_pack_dim, pack_send, unpack_combine, lse_reduce = (
    dcp_a2a.lse_pack_dim, dcp_a2a.pack_send, dcp_a2a.unpack_combine, dcp_a2a.lse_reduce)
