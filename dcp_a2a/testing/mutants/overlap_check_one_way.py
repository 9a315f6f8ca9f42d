"""Aliasing: the overlap check only asks whether the input starts inside the staging buffer, so a staging buffer carved from the tail of the attention output (starting inside it) is not refused and overwrites rows still to be packed."""

import dcp_a2a
from dcp_a2a import ops as _ops
from dcp_a2a import wire as _wire

# Process-wide patch, as in staging_aliases_input (a mutant's session tests only the mutant).
if not (callable(getattr(_ops, "require_disjoint", None))
        and callable(getattr(_wire, "_span", None))):
    raise ImportError("dcp_a2a.ops.require_disjoint / dcp_a2a.wire._span not found: update "
                      "this mutant")


def _one_way(dst_name, dst, **sources):
    d0, d1 = _wire._span(dst)
    for name, src in sources.items():
        if src is not None and src.numel() and d0 <= _wire._span(src)[0] < d1:
            raise ValueError(f"{dst_name} overlaps {name}")


_ops.require_disjoint = _one_way

lse_pack_dim, pack_send, unpack_combine, lse_reduce = (
    dcp_a2a.lse_pack_dim, _ops.pack_send, dcp_a2a.unpack_combine, dcp_a2a.lse_reduce)
