"""The public ops as torch custom ops, for code compiled with ``torch.compile``.

Under ``torch.compile`` (``torch.compiler.is_dynamo_compiling()``), :func:`dcp_a2a.pack_send`,
:func:`dcp_a2a.unpack_combine` and :func:`dcp_a2a.lse_reduce` trace as these ops, so a model
compiled with ``fullgraph=True`` goes through them without a graph break; eagerly they never
come here (an eager call keeps its checked fast path: the test costs one call of
``is_dynamo_compiling``, ~0.05 us).

    dcp_a2a::pack_send(out, lse, send!, world_size, h_per_rank, head_dim, lse_pack_dim,
                       seq_lens?, query_start_loc?) -> ()
    dcp_a2a::unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)
        -> (out, lse)            (lse: an empty tensor unless return_lse)
    dcp_a2a::unpack_combine_into(recv, into!, head_dim, lse_pack_dim, return_lse,
                                 is_lse_base_on_e) -> lse     (empty unless return_lse)
    dcp_a2a::project(x, w, y!) -> ()

(``!``: mutated, declared in ``mutates_args``.) Each op's implementation is the eager function
itself, checks included: a compiled graph checks its arguments when it runs, as an eager call
does (a check there reads real addresses, which a trace has not got). Each op's fake
implementation gives the result's shape, dtype and device without running anything.

In a compiled ``lse_reduce`` the exchange is ``torch.distributed._functional_collectives
.all_to_all_single`` (a collective the graph holds, which inductor schedules and CUDA graphs
capture) between the pack and the combine; the staging buffers are the graph's own tensors
(``dcp_a2a.buffers`` is the eager path's). Compiled, ``lse_reduce`` runs backend "packed"; the
others, ``buffers=`` and ``check_ranks`` run eagerly (a graph break, an error under
``fullgraph=True`` naming ``_lse_reduce_eagerly``). It needs a
``device_group`` that torch registered (a ProcessGroup from ``init_process_group`` /
``new_group``: the functional collectives address a group by its registered name).

What a compiled call checks: shapes, dtypes, devices and values at trace time (as guards); in
the ops, when the graph runs, everything the eager ops check (a caller's buffer against recv
included), but not a caller's buffer against the partials and the LSE, which only the eager
``lse_reduce`` reads addresses for (the graph's own staging cannot overlap them).
"""

from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor


@torch.library.custom_op("dcp_a2a::pack_send", mutates_args=("send",))
def pack_send(out: Tensor, lse: Tensor, send: Tensor, world_size: int, h_per_rank: int,
              head_dim: int, lse_pack_dim: int, seq_lens: Optional[Tensor] = None,
              query_start_loc: Optional[Tensor] = None) -> None:
    from .ops import pack_send as eager

    eager(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim, seq_lens,
          query_start_loc)


@pack_send.register_fake
def _pack_send_fake(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                    seq_lens=None, query_start_loc=None):
    return None


@torch.library.custom_op("dcp_a2a::unpack_combine", mutates_args=())
def unpack_combine(recv: Tensor, head_dim: int, lse_pack_dim: int, return_lse: bool,
                   is_lse_base_on_e: bool) -> tuple[Tensor, Tensor]:
    from .ops import unpack_combine as eager

    res = eager(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)
    if return_lse:
        return res
    return res, recv.new_empty((0,), dtype=torch.float32)


@unpack_combine.register_fake
def _unpack_combine_fake(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
    n, b, hpr, _ = recv.shape
    out = recv.new_empty((b, hpr, head_dim))
    lse = recv.new_empty((b, hpr) if return_lse else (0,), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("dcp_a2a::unpack_combine_into", mutates_args=("into",))
def unpack_combine_into(recv: Tensor, into: Tensor, head_dim: int, lse_pack_dim: int,
                        return_lse: bool, is_lse_base_on_e: bool) -> Tensor:
    from .ops import unpack_combine as eager

    res = eager(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e, into=into)
    return res[1] if return_lse else recv.new_empty((0,), dtype=torch.float32)


@unpack_combine_into.register_fake
def _unpack_combine_into_fake(recv, into, head_dim, lse_pack_dim, return_lse,
                              is_lse_base_on_e):
    _, b, hpr, _ = recv.shape
    return recv.new_empty((b, hpr) if return_lse else (0,), dtype=torch.float32)


@torch.library.custom_op("dcp_a2a::project", mutates_args=("y",))
def project(x: Tensor, w: Tensor, y: Tensor) -> None:
    from .kernels.project import project as kernel

    kernel(x, w, y)


@project.register_fake
def _project_fake(x, w, y):
    return None
