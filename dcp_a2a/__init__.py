"""dcp_a2a: the packed all-to-all combine for Decode Context Parallel attention.

Public contract (names, signatures and keyword names are stable):
    lse_pack_dim(dtype) -> int
    pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
              seq_lens=None, query_start_loc=None) -> None
    unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e, into=None)
    lse_reduce(out, lse, group, *, return_lse=False, is_lse_base_on_e=True, seq_lens=None,
               query_start_loc=None, backend="packed", buffers=None, check_ranks=None,
               into=None, w_uv=None, up_proj="auto")
    Group(world_size, rank_in_group, device_group); Group.from_process_group(pg)
    SymmMemBuffers(group, *, max_tokens, num_heads, head_dim, dtype, device=None)
        (the buffers of ``lse_reduce(..., backend="symm_mem", buffers=...)``)

The product: this package, :mod:`dcp_a2a.kernels` (the Triton kernels and launch table),
:mod:`dcp_a2a.wire` (the format and its checks), :mod:`dcp_a2a.buffers` (staging under CUDA
graphs) and :mod:`dcp_a2a.inprocess` (N ranks in one process). It imports nothing of the
validation harness, :mod:`dcp_a2a.testing` (``dcp-a2a validate``, the conformance suite, the
accuracy job, the benchmark).
"""

from . import _env  # noqa: F401  (must run before any Triton kernel is defined)
from .buffers import StagingBuffers
from .collective import BACKENDS, Group, lse_reduce, lse_reduce_steps
from .ops import pack_send, unpack_combine
from .symm_mem import SymmMemBuffers
from .wire import lse_pack_dim

__all__ = [
    "BACKENDS",
    "Group",
    "StagingBuffers",
    "SymmMemBuffers",
    "lse_pack_dim",
    "lse_reduce",
    "lse_reduce_steps",
    "pack_send",
    "unpack_combine",
]
__version__ = "0.1.0"
