"""Worked example: a thin adapter that puts an engine's DCP combine behind the dcp_a2a contract,
so the conformance tier can validate it:

    pytest -m conformance --impl dcp_a2a.reference.adapter_example -n 2       # its functions
    pytest -m conformance --impl dcp_a2a.reference.adapter_example:IMPL -n 2  # its instance

The "engine" here is :mod:`reference.wire`: pack/unpack functions that take positional
arguments and check almost nothing, and no ``lse_reduce`` at all — the situation of an engine
whose kernels exist but whose public surface differs from the contract. Replace the three
``engine_*`` calls with your engine's kernels and communicator (e.g. a vLLM-style custom op
and ``GroupCoordinator``) and the rest stays as it is.

The adapter subclasses :class:`reference.contract.ReferenceContract`, which brings the contract's
argument checks (ValueError/TypeError naming the problem, before any collective) and the
``lse_reduce`` orchestration (staging buffer, one all_to_all_single, combine); it overrides only
the three steps that do the work. An engine that already validates its arguments can instead
map its functions one to one (a module exposing ``lse_pack_dim``, ``pack_send``,
``unpack_combine`` and ``lse_reduce`` with the contract's signatures is all ``--impl`` needs):

    # my_engine_dcp_adapter.py
    from my_engine import ops, comm
    def lse_pack_dim(dtype): return ops.dcp_lse_lanes(dtype)
    def pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                  seq_lens=None, query_start_loc=None):
        ops.dcp_pack(out, lse, send, world_size, head_dim, lse_pack_dim,
                     kv_lens=seq_lens, cu_seqlens_q=query_start_loc)
    def unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
        return ops.dcp_unpack_merge(recv, head_dim, lse_pack_dim, return_lse,
                                    natural_base=is_lse_base_on_e)
    def lse_reduce(out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        return comm.dcp_combine(out, lse, group, return_lse=return_lse,
                                natural_base=is_lse_base_on_e, kv_lens=seq_lens,
                                cu_seqlens_q=query_start_loc)

``group`` is whatever the suite hands over: an object with ``world_size``, ``rank_in_group`` and
``device_group`` (a torch.distributed ProcessGroup), the attributes of vLLM's GroupCoordinator.
"""

from __future__ import annotations

import torch

from . import wire as engine_kernels  # stands in for the engine's kernel library
from .contract import ReferenceContract


class EngineAdapter(ReferenceContract):
    """Contract checks and orchestration inherited; pack, combine and exchange are the
    engine's."""

    def _pack(self, out, lse, send, world_size, hpr, D, seq_lens, query_start_loc):
        # engine kernel 1: pack out + LSE into the wire buffer (masking fused)
        engine_kernels.pack_send(out, lse, send, world_size, hpr, D,
                                 self.lse_pack_dim(out.dtype), seq_lens=seq_lens,
                                 query_start_loc=query_start_loc)

    def _combine(self, recv, head_dim, return_lse, is_lse_base_on_e):
        # engine kernel 2: unpack and merge the N received states of this rank's heads
        return engine_kernels.unpack_combine(recv, head_dim, self.lse_pack_dim(recv.dtype),
                                             return_lse, is_lse_base_on_e)

    def exchange(self, send, group):
        # the engine's communicator: one all_to_all_single on the DCP group's device group
        if group.world_size == 1:
            return send
        import torch.distributed as dist

        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group.device_group)
        return recv


# ``--impl my_adapter:IMPL`` names this instance (the methods are the contract functions);
# ``--impl my_adapter`` takes the module's functions below, the same ones
IMPL = EngineAdapter()
lse_pack_dim, pack_send, unpack_combine, lse_reduce = IMPL.functions()
