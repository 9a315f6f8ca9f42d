"""``--impl vllm``: the vLLM installed on this machine, through its own DCP all-to-all functions.

vLLM keeps them in ``vllm.v1.attention.ops.dcp`` (older releases:
``vllm.v1.attention.ops.dcp_alltoall``)::

    _dcp_a2a_lse_pack_dim(output_dtype) -> int
    _dcp_a2a_pack_send(cp_attn_out, cp_attn_lse, send_buffer, world_size, h_per_rank,
                       head_dim, lse_pack_dim, seq_lens=None, query_start_loc=None)
    _dcp_a2a_unpack_combine(recv_buffer, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)
    dcp_a2a_lse_reduce(cp_attn_out, cp_attn_lse, cp_group, ctx=None, return_lse=False,
                       is_lse_base_on_e=True, seq_lens=None, query_start_loc=None)

``cp_group`` is vLLM's GroupCoordinator; the contract's group (``world_size``,
``rank_in_group``, ``device_group``) is handed over as it is, with the GroupCoordinator names
vLLM may also read (``rank``, ``ranks``, ``cpu_group``) derived from it.
"""

from __future__ import annotations

import importlib
import importlib.util

MODULES = ("vllm.v1.attention.ops.dcp", "vllm.v1.attention.ops.dcp_alltoall")
NAMES = ("_dcp_a2a_lse_pack_dim", "_dcp_a2a_pack_send", "_dcp_a2a_unpack_combine",
         "dcp_a2a_lse_reduce")


def _find():
    if importlib.util.find_spec("vllm") is None:
        raise ImportError("--impl vllm: vLLM is not installed in this environment "
                          "(pip install vllm, or pass --impl package.module of your adapter)")
    tried = []
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            tried.append(f"{name} ({e})")
            continue
        missing = [n for n in NAMES if not callable(getattr(mod, n, None))]
        if missing:
            tried.append(f"{name} (no {', '.join(missing)})")
            continue
        return mod
    raise ImportError("--impl vllm: this vLLM has no DCP all-to-all functions: "
                      + "; ".join(tried))


class _Adapter:
    """The contract over one loaded copy of vLLM's ops."""

    def __init__(self, ops):
        self.OPS = ops

    def lse_pack_dim(self, dtype):
        return self.OPS._dcp_a2a_lse_pack_dim(dtype)

    def pack_send(self, out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                  seq_lens=None, query_start_loc=None):
        return self.OPS._dcp_a2a_pack_send(out, lse, send, world_size, h_per_rank, head_dim,
                                           lse_pack_dim, seq_lens=seq_lens,
                                           query_start_loc=query_start_loc)

    def unpack_combine(self, recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
        return self.OPS._dcp_a2a_unpack_combine(recv, head_dim, lse_pack_dim, return_lse,
                                                is_lse_base_on_e)

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        return self.OPS.dcp_a2a_lse_reduce(out, lse, _Coordinator(group), ctx=None,
                                           return_lse=return_lse,
                                           is_lse_base_on_e=is_lse_base_on_e,
                                           seq_lens=seq_lens, query_start_loc=query_start_loc)


def adapter(variant=None, source=None):
    """The implementation object of ``--impl vllm``."""
    if variant is not None or source is not None:
        raise ValueError("this vLLM adapter takes no variant or release path yet")
    return _Adapter(_find())


class _Coordinator:
    """The contract's group seen as a vLLM GroupCoordinator."""

    def __init__(self, group):
        self.world_size = group.world_size
        self.rank_in_group = group.rank_in_group
        self.device_group = group.device_group
        self.cpu_group = getattr(group, "cpu_group", group.device_group)
        self.ranks = list(getattr(group, "ranks", range(group.world_size)))
        self.rank = getattr(group, "rank", self.ranks[group.rank_in_group])

    def __getattr__(self, name):
        raise AttributeError(f"the vLLM adapter's group has no {name!r}: vLLM's "
                             f"dcp_a2a_lse_reduce needs more of its GroupCoordinator than the "
                             f"contract's group (world_size, rank_in_group, device_group)")


