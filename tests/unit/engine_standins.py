"""Small stand-ins for vLLM 0.34.0, SGLang 0.5.23 and FlashInfer 0.7.4: each engine's module
paths, the names the adapters read and their signatures, with bodies of our own on the
reference contract (``dcp_a2a.reference``) or plain torch. CI downloads no engine; these carry
the adapters' plumbing (installed form, release form, one-line refusals) through the tests.

Every body imports what it needs itself: the release form reads only the named definitions
of a file (with a prelude of torch and triton), never its module-level imports, which here, as
in the engines, name the engine's own internals (present in the installed tree only)."""

from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

VLLM_DCP = '''
"""Stand-in for vLLM 0.34.0's vllm/v1/attention/ops/dcp.py."""
from __future__ import annotations

import torch
import torch.distributed as dist

from vllm.distributed import get_dcp_group  # the engine's own internals


def _validate_dcp_empty_shard_args(seq_lens, query_start_loc):
    if seq_lens is None and query_start_loc is None:
        return False
    if seq_lens is None or query_start_loc is None:
        raise ValueError("seq_lens and query_start_loc must be provided together")
    return True


def _dcp_a2a_lse_pack_dim(output_dtype):
    from dcp_a2a.reference import contract

    return contract.lse_pack_dim(output_dtype)


def _dcp_a2a_send_recv_buffers(shape, device, dtype):
    return (torch.empty(shape, device=device, dtype=dtype),
            torch.empty(shape, device=device, dtype=dtype))


def _dcp_a2a_pack_send_kernel(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                              seq_lens, query_start_loc):
    from dcp_a2a.reference import contract

    contract.pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                       seq_lens=seq_lens, query_start_loc=query_start_loc)


def _dcp_a2a_unpack_combine_kernel(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
    from dcp_a2a.reference import contract

    return contract.unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)


def _dcp_a2a_pack_send(cp_attn_out, cp_attn_lse, send_buffer, world_size, h_per_rank,
                       head_dim, lse_pack_dim, seq_lens=None, query_start_loc=None):
    _validate_dcp_empty_shard_args(seq_lens, query_start_loc)
    _dcp_a2a_pack_send_kernel(cp_attn_out, cp_attn_lse, send_buffer, world_size, h_per_rank,
                              head_dim, lse_pack_dim, seq_lens, query_start_loc)


def _dcp_a2a_unpack_combine(recv_buffer, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e,
                            out=None):
    merged = _dcp_a2a_unpack_combine_kernel(recv_buffer, head_dim, lse_pack_dim, return_lse,
                                            is_lse_base_on_e)
    if out is None:
        return merged
    out.copy_(merged[0] if return_lse else merged)
    return (out, merged[1]) if return_lse else out


def dcp_a2a_lse_reduce(cp_attn_out, cp_attn_lse, cp_group, ctx=None, return_lse=False,
                       is_lse_base_on_e=True, seq_lens=None, query_start_loc=None, out=None):
    n = cp_group.world_size
    if n == 1 and out is None:
        return (cp_attn_out, cp_attn_lse) if return_lse else cp_attn_out
    b, h, d = cp_attn_out.shape
    if h % n:
        raise ValueError(f"H={h} must be divisible by DCP world size {n}.")
    p = _dcp_a2a_lse_pack_dim(cp_attn_out.dtype)
    send, recv = _dcp_a2a_send_recv_buffers((n, b, h // n, d + p), cp_attn_out.device,
                                            cp_attn_out.dtype)
    _dcp_a2a_pack_send(cp_attn_out, cp_attn_lse, send, n, h // n, d, p, seq_lens=seq_lens,
                       query_start_loc=query_start_loc)
    dist.all_to_all_single(recv.view(-1), send.view(-1), group=cp_group.device_group)
    return _dcp_a2a_unpack_combine(recv, d, p, return_lse, is_lse_base_on_e, out)


_V_UP_PROJ_FIRST_MIN_TOKENS = 8


def dcp_a2a_v_up_proj_lse_reduce(cp_attn_out, cp_attn_lse, w_uv, out, cp_group,
                                 is_lse_base_on_e=True, seq_lens=None, query_start_loc=None):
    b, h, _ = cp_attn_out.shape
    hpr, r, v = h // cp_group.world_size, cp_group.rank_in_group, w_uv.shape[-1]
    latent = dcp_a2a_lse_reduce(cp_attn_out, cp_attn_lse, cp_group,
                                is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
                                query_start_loc=query_start_loc)
    proj = torch.einsum("bhl,hlv->bhv", latent.double(), w_uv[r * hpr:(r + 1) * hpr].double())
    out.view(b, hpr, v).copy_(proj)


def cp_lse_ag_out_rs(cp_attn_out, cp_attn_lse, cp_group, ctx=None, return_lse=False,
                     is_lse_base_on_e=True, seq_lens=None, query_start_loc=None):
    import math

    from dcp_a2a.reference.wire import row_mask

    n = cp_group.world_size
    if n == 1:
        return (cp_attn_out, cp_attn_lse) if return_lse else cp_attn_out
    lse = cp_attn_lse.double()
    if seq_lens is not None:
        empty = row_mask(lse.shape[0], seq_lens, query_start_loc, lse.device)
        lse = lse.masked_fill(empty[:, None], -math.inf)
    lses = cp_group.all_gather(lse.contiguous(), dim=0).view((n,) + lse.shape)
    lses = torch.where(torch.isnan(lses) | (lses == math.inf), -math.inf, lses)
    scale = 1.0 if is_lse_base_on_e else math.log(2)
    g = torch.logsumexp(lses * scale, dim=0)
    w = torch.exp(lses[cp_group.rank_in_group] * scale - g).nan_to_num(0.0)
    scaled = torch.where(w[..., None] > 0, cp_attn_out.double() * w[..., None], 0.0)
    merged = cp_group.reduce_scatter(scaled, dim=1).to(cp_attn_out.dtype)
    if not return_lse:
        return merged
    hpr, r = lse.shape[1] // n, cp_group.rank_in_group
    return merged, (g / scale)[:, r * hpr:(r + 1) * hpr].float()
'''

SGLANG_KERNELS = '''
"""Stand-in for SGLang 0.5.23's sglang/kernels/ops/attention/dcp_kernels.py."""
from typing import Optional, Tuple

import torch


def _lse_pack_dim(output_dtype):
    return torch.finfo(torch.float32).bits // torch.finfo(output_dtype).bits


def _dcp_pack_a2a_send_kernel(out, lse, dst_o, dst_lse):
    n, hpr, b = dst_lse.shape[0], dst_lse.shape[2], out.shape[0]
    dst_o[:, :b].copy_(out.unflatten(1, (n, hpr)).transpose(0, 1))
    dst_lse[:, :b].copy_(lse.unflatten(1, (n, hpr)).transpose(0, 1))


def dcp_pack_a2a_send(cp_attn_out, cp_attn_lse, dst_o, dst_lse):
    b, h, d = cp_attn_out.shape
    n, b_max, hpr = dst_lse.shape
    if cp_attn_lse.dtype != torch.float32 or dst_lse.dtype != torch.float32:
        raise ValueError("LSE tensors must be float32")
    if d % _lse_pack_dim(cp_attn_out.dtype):
        raise ValueError(f"head dim {d} must be a multiple of the LSE pack dim")
    if dst_o.shape != (n, b_max, hpr, d) or hpr * n != h or b > b_max:
        raise ValueError("destination does not match out")
    _dcp_pack_a2a_send_kernel(cp_attn_out, cp_attn_lse, dst_o, dst_lse)


def _dcp_lse_combine_kernel(recv_output, recv_lse, is_base_e):
    from dcp_a2a.reference.combine import lse_weighted_combine

    out, g = lse_weighted_combine(recv_output, recv_lse, True, is_base_e)
    return out.to(recv_output.dtype), g.to(recv_lse.dtype)


def dcp_lse_combine_triton(recv_output, recv_lse, is_lse_base_on_e=True, return_lse=False):
    out, lse = _dcp_lse_combine_kernel(recv_output, recv_lse, is_lse_base_on_e)
    return out, (lse if return_lse else None)


def _correct_attn_cp_out_kernel(out, lses, rank, is_base_e):
    import math

    scale = 1.0 if is_base_e else math.log(2)
    s = torch.where(torch.isnan(lses) | (lses == math.inf), -math.inf, lses.double()) * scale
    w = torch.exp(s[rank] - torch.logsumexp(s, dim=0)).nan_to_num(0.0)
    return (out.double() * w[..., None]).transpose(0, 1)


class CPTritonContext:
    def __init__(self):
        self.inner_kernel = None


def correct_attn_out(out, lses, cp_rank, ctx, new_output=None, is_lse_base_on_e=False):
    new_output.copy_(_correct_attn_cp_out_kernel(out, lses, cp_rank, is_lse_base_on_e))
    return new_output, None
'''

SGLANG_COMM = '''
"""Stand-in for SGLang 0.5.23's sglang/srt/layers/dcp/comm.py."""
from typing import Optional

import torch

from sglang.kernels.ops.attention.dcp_kernels import (
    CPTritonContext,
    _lse_pack_dim,
    correct_attn_out,
    dcp_lse_combine_triton,
    dcp_pack_a2a_send,
)
from sglang.srt.distributed.device_communicators.pynccl_allocator import use_symmetric_memory
from sglang.srt.distributed.parallel_state import GroupCoordinator
from sglang.srt.runtime_context import get_parallel

_FI_A2A_STATE: Optional[dict] = None


def _ag_lse(cp_attn_lse, cp_group):
    return cp_group.all_gather(cp_attn_lse, dim=0).view((cp_group.world_size,) + cp_attn_lse.shape)


def cp_lse_ag_out_rs_mha(cp_attn_out, cp_attn_lse, cp_group: GroupCoordinator, return_lse=False):
    if cp_group.world_size == 1:
        return (cp_attn_out, cp_attn_lse) if return_lse else cp_attn_out
    lses = _ag_lse(cp_attn_lse.contiguous(), cp_group)
    g = torch.logsumexp(lses, dim=0)
    scale = torch.exp(cp_attn_lse - g).unsqueeze(-1).nan_to_num(0.0, 0.0, 0.0)
    out = cp_group.all_reduce(cp_attn_out.nan_to_num(0.0, 0.0, 0.0) * scale)
    hpr, r = g.shape[1] // cp_group.world_size, cp_group.rank_in_group
    out = out[:, hpr * r:hpr * (r + 1)].contiguous()
    return (out, g[:, hpr * r:hpr * (r + 1)].contiguous()) if return_lse else out


def cp_lse_ag_out_rs_mla(cp_attn_out, cp_attn_lse, cp_group: GroupCoordinator,
                         ctx: Optional[CPTritonContext] = None, is_lse_base_on_e=False):
    if cp_group.world_size == 1:
        return cp_attn_out
    with use_symmetric_memory(cp_group):
        new_output = cp_attn_out.new_empty(cp_attn_out.transpose(0, 1).shape,
                                           dtype=torch.float32)
    lses = _ag_lse(cp_attn_lse.to(torch.float32), cp_group)
    out, _ = correct_attn_out(cp_attn_out, lses, cp_group.rank_in_group, ctx, new_output,
                              is_lse_base_on_e=is_lse_base_on_e)
    return cp_group.reduce_scatter_along_dim(out, dim=0).to(cp_attn_out.dtype)


def init_fi_a2a_workspace(cp_group):
    raise RuntimeError("the stand-in has no FlashInfer")


def dcp_a2a_lse_reduce(cp_attn_out, cp_attn_lse, cp_group: "GroupCoordinator",
                       is_lse_base_on_e=True, cuda_graph_buffers=None, comm_backend="a2a"):
    if cp_group.world_size == 1:
        return cp_attn_out
    n = cp_group.world_size
    b, h, d = cp_attn_out.shape
    lpd = _lse_pack_dim(cp_attn_out.dtype)
    send = torch.empty(n, b, h // n, d + lpd, dtype=cp_attn_out.dtype,
                       device=cp_attn_out.device)
    recv = torch.empty_like(send)
    dcp_pack_a2a_send(cp_attn_out, cp_attn_lse, send[..., :d],
                      send.view(torch.float32)[..., d // lpd])
    cp_group.all_to_all_single(recv.reshape(-1).view(torch.uint8),
                               send.reshape(-1).view(torch.uint8))
    merged, _ = dcp_lse_combine_triton(recv[..., :d], recv.view(torch.float32)[..., d // lpd],
                                       is_lse_base_on_e=is_lse_base_on_e)
    return merged


def _dcp_fi_a2a_lse_reduce(cp_attn_out, cp_attn_lse, cp_group, is_lse_base_on_e=True):
    raise RuntimeError("the stand-in has no FlashInfer")
'''

FLASHINFER_CASCADE = '''
"""Stand-in for FlashInfer 0.7.4's flashinfer/triton/kernels/cascade.py: each kernel is
launched as kernel[grid](...), as a Triton kernel is."""
import torch


def state_merge(o, m, d, other_o, other_m, other_d):
    m_max = torch.maximum(m, other_m)
    scale, other = torch.exp2(m - m_max), torch.exp2(other_m - m_max)
    return o * scale + other_o * other, m_max, d * scale + other_d * other


def state_normalize(o, m, d):
    return o / d, m, d


def state_get_lse(o, m, d):
    return m + torch.log2(d)


class merge_state_kernel:
    def __class_getitem__(cls, grid):
        def launch(v_a, s_a, v_b, s_b, v_merged, s_merged, num_heads, head_dim, bdx, bdy):
            from dcp_a2a.reference.combine import lse_weighted_combine

            out, g = lse_weighted_combine(torch.stack([v_a, v_b]), torch.stack([s_a, s_b]),
                                          True, False)
            v_merged.copy_(out)
            s_merged.copy_(g)
        return launch


class merge_states_kernel:
    def __class_getitem__(cls, grid):
        def launch(v, s, v_merged, s_merged, num_index_sets, num_heads, head_dim, bdx, bdy):
            from dcp_a2a.reference.combine import lse_weighted_combine

            out, g = lse_weighted_combine(v.transpose(0, 1), s.transpose(0, 1), True, False)
            v_merged.copy_(out)
            s_merged.copy_(g)
        return launch
'''

# the engine-internal modules the stand-ins' files import, for the installed tree only
_INTERNALS = {
    "vllm/distributed/__init__.py": "def get_dcp_group():\n    raise RuntimeError('no DCP')\n",
    "sglang/srt/distributed/device_communicators/pynccl_allocator.py":
        "from contextlib import nullcontext\n\n\n"
        "def use_symmetric_memory(group_coordinator, disabled=False):\n"
        "    return nullcontext()\n",
    "sglang/srt/distributed/parallel_state.py": "class GroupCoordinator:\n    pass\n",
    "sglang/srt/runtime_context.py": "def get_parallel():\n    raise ValueError('no server')\n",
}

# engine -> (distribution name in a wheel's file name, version, {member: source})
# vLLM 0.30.0-0.33.0: the same packed all-to-all, without out= and without the up-projection op
# (a ``replace`` for the vLLM stand-in)
VLLM_EARLIER = {
    "is_lse_base_on_e,\n                            out=None):\n":
        "is_lse_base_on_e):\n    out = None\n",
    "query_start_loc=None, out=None):\n    n = cp_group.world_size":
        "query_start_loc=None):\n    out = None\n    n = cp_group.world_size",
    "def dcp_a2a_v_up_proj_lse_reduce(": "def _not_in_this_release(",
    "_V_UP_PROJ_FIRST_MIN_TOKENS = 8": "_NOT_IN_THIS_RELEASE = 8",
}

# SGLang 0.5.17: its merge and exchange, no pack kernel (a ``replace`` for the SGLang stand-in)
SGLANG_EARLIER = {
    "def _dcp_pack_a2a_send_kernel(": "def _not_in_this_release(",
    "def dcp_pack_a2a_send(": "def _nor_this(",
    "    dcp_pack_a2a_send,\n)": ")",
    # its dcp_a2a_lse_reduce packs the buffer with torch copies
    ("    dcp_pack_a2a_send(cp_attn_out, cp_attn_lse, send[..., :d],\n"
     "                      send.view(torch.float32)[..., d // lpd])"):
        ("    send[..., :d].copy_(cp_attn_out.view(b, n, h // n, d).transpose(0, 1))\n"
         "    send.view(torch.float32)[..., d // lpd].copy_(\n"
         "        cp_attn_lse.view(b, n, h // n).transpose(0, 1))"),
}

ENGINES = {
    "vllm": ("vllm", "0.34.0", {"vllm/v1/attention/ops/dcp.py": VLLM_DCP}),
    "sglang": ("sglang", "0.5.23", {
        "sglang/kernels/ops/attention/dcp_kernels.py": SGLANG_KERNELS,
        "sglang/srt/layers/dcp/comm.py": SGLANG_COMM}),
    "flashinfer": ("flashinfer_python", "0.7.4", {
        "flashinfer/triton/kernels/cascade.py": FLASHINFER_CASCADE}),
}


def members(engine: str, replace: dict | None = None) -> dict[str, str]:
    """{member path: source} of ``engine``'s stand-in, with ``replace`` ({old: new} applied to
    every source) for a variant of it."""
    out = {}
    for member, text in ENGINES[engine][2].items():
        text = textwrap.dedent(text).lstrip()
        for old, new in (replace or {}).items():
            text = text.replace(old, new)
        out[member] = text
    return out


def installed_tree(root: Path, engine: str, replace: dict | None = None) -> Path:
    """``engine``'s stand-in as an installed package tree under ``root`` (every package has
    its __init__.py; the internals its files import are there); returns ``root``."""
    files = dict(members(engine, replace))
    files.update({k: v for k, v in _INTERNALS.items() if k.startswith(engine + "/")})
    for member, text in files.items():
        path = root / member
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        d = path.parent
        while d != root:
            (d / "__init__.py").touch()
            d = d.parent
    return root


def wheel(directory: Path, engine: str, replace: dict | None = None,
          drop: tuple = ()) -> Path:
    """``engine``'s stand-in as a wheel in ``directory`` (its members at the engine's paths,
    a dist-info with its version), less the members in ``drop``."""
    dist, version, _ = ENGINES[engine]
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in members(engine, replace).items():
            if member not in drop:
                z.writestr(member, text)
        z.writestr(f"{dist}-{version}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return path


def source_file(directory: Path, engine: str, member: str | None = None,
                replace: dict | None = None) -> Path:
    """One of ``engine``'s stand-in files alone in ``directory`` (by default its first)."""
    files = members(engine, replace)
    member = member or next(iter(files))
    path = directory / Path(member).name
    path.write_text(files[member])
    return path
