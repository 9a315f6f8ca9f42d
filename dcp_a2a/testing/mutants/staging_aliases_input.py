"""Aliasing: the project's pack kernel without its overlap check, so a staging buffer carved from the attention output's memory overwrites the input it packs."""

import dcp_a2a
from dcp_a2a import ops as _ops

# The patch is process-wide, which is fine: a mutant's pytest session tests only the mutant
# (the float64 oracle lives in dcp_a2a.reference). If the check is renamed, the patch below
# fails to find it and the mutant raises at import, which the self-check reports as a broken
# mutant.
if not callable(getattr(_ops, "require_disjoint", None)):
    raise ImportError("dcp_a2a.ops.require_disjoint not found: update this mutant")
_ops.require_disjoint = lambda *args, **kwargs: None

lse_pack_dim, pack_send, unpack_combine, lse_reduce = (
    dcp_a2a.lse_pack_dim, _ops.pack_send, dcp_a2a.unpack_combine, dcp_a2a.lse_reduce)
