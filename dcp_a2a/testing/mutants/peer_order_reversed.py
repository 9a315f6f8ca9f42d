"""Misordered exchange: the project's packed path with the send slices handed to all_to_all_single in reverse peer order, so rank r merges the heads of rank N-1-r."""

import torch.distributed as dist

import dcp_a2a
from dcp_a2a.collective import _local_step, drive, lse_reduce_steps
from dcp_a2a.wire import check_group

lse_pack_dim, pack_send, unpack_combine = (dcp_a2a.lse_pack_dim, dcp_a2a.pack_send,
                                           dcp_a2a.unpack_combine)


def _step(kind, payload, group):
    if group.world_size == 1:
        return _local_step(kind, payload)
    send, recv = payload
    dist.all_to_all_single(recv, send.flip(0).contiguous(), group=group.device_group)
    return recv


def lse_reduce(out, lse, group, *, return_lse=False, is_lse_base_on_e=True, seq_lens=None,
               query_start_loc=None):
    n, r = check_group(group)
    steps = lse_reduce_steps(out, lse, n, r, return_lse=return_lse,
                             is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
                             query_start_loc=query_start_loc, backend="packed")
    return drive(steps, lambda kind, payload: _step(kind, payload, group))
