"""Aliasing: the overlap check covers the attention output but not the LSE, so a staging buffer carved over the LSE tensor overwrites the LSEs it is packing."""

import dcp_a2a
from dcp_a2a import ops as _ops

# Process-wide patch, as in staging_aliases_input (a mutant's session tests only the mutant).
if not callable(getattr(_ops, "require_disjoint", None)):
    raise ImportError("dcp_a2a.ops.require_disjoint not found: update this mutant")
_check = _ops.require_disjoint
_ops.require_disjoint = lambda dst_name, dst, **sources: _check(dst_name, dst,
                                                                out=sources.get("out"))

lse_pack_dim, pack_send, unpack_combine, lse_reduce = (
    dcp_a2a.lse_pack_dim, _ops.pack_send, dcp_a2a.unpack_combine, dcp_a2a.lse_reduce)
