"""``--impl flashinfer[:VARIANT][=PATH]``: FlashInfer's merge of attention states (it follows
FlashInfer 0.7.4, package ``flashinfer-python``), installed here or read from its release.

FlashInfer exposes the merge surface only: it has no wire format and no exchange of its own on
one GPU. Its LSEs are base 2 (``merge_states`` has no base parameter: base-e merges are not
applicable). Variants (``cascade`` is the default):

``cascade``
    ``merge(outs[N, B, H, D], lses[N, B, H], is_lse_base_on_e=False, return_lse)`` ->
    ``merge_states(v[B, N, H, D], s[B, N, H])``. FlashInfer takes the partials' axis second
    and asserts contiguous inputs, so the adapter hands it the contract's tensors transposed
    into that layout (one contiguous copy each): how FlashInfer would treat the caller's
    strides is not judged (it refuses non-contiguous inputs loudly).
``merge_state``
    The same merge as a chain of FlashInfer's pairwise ``merge_state(v_a, s_a, v_b, s_b)``
    over the N partials (0 with 1, the result with 2, ...): the kernel engines use to merge a
    cascade's prefix and suffix, rounding each intermediate to the output dtype as a caller
    chaining it does. The partials ``outs[i]`` / ``lses[i]`` are passed as they are. One
    partial alone has nothing to merge (not applicable).
``a2a``
    ``lse_reduce(out, lse, group, *, is_lse_base_on_e)`` ->
    ``flashinfer.comm.decode_cp_a2a_lse_reduce(partial_o, partial_lse, workspace, rank, N,
    lse_mode)``: the exchange and the merge fused in one kernel over NCCL symmetric memory.
    ``partial_o[B, H/N, N, D]`` is the contract's ``out`` with the peer axis second to last
    (peer p gets heads ``[p H/N, (p+1) H/N)``; one contiguous copy), likewise the LSE. One
    workspace (``decode_cp_a2a_lse_reduce_create_workspace``) per group, heads, head dim and
    dtype, grown when a call has more rows. Installed FlashInfer on 2 or more CUDA GPUs of an
    NCCL group only; no LSE is returned (not applicable).

Which code runs the merge: with FlashInfer installed and CUDA, its CUDA kernels
(``flashinfer.merge_states`` / ``merge_state``: fp16/bf16 outputs, head dims 64, 128, 256,
512). Otherwise (the release form ``=PATH``: the wheel, ``pip download --no-deps
flashinfer-python==0.7.4 -d DIR``, an unpacked tree or the file itself; or an installed
FlashInfer without CUDA) FlashInfer's Triton kernels, read by name from
``flashinfer/triton/kernels/cascade.py`` (:mod:`._release`) and launched the way its host
wrappers in ``flashinfer/triton/cascade.py`` launch them (same grid, arguments and
allocations; their input checks kept as ValueErrors), less the wrappers' assertion that the
tensors are CUDA tensors on a Hopper GPU, which is all that keeps them off the CPU
interpreter.

Envelope: base-2 LSEs only. FlashInfer's CUDA merge also refuses head dims other than 64,
128, 256, 512 and fp32 outputs; the envelope can say neither exactly yet (declared: powers
of two).
"""

from __future__ import annotations

import torch

from ..surfaces import Envelope, Unsupported
from . import ENGINE_VARIANTS, GPUS_NEEDED, _release
from ._common import cuda_gpus, installed_root, installed_version, pick_variant, refuse_release, \
    require_gpus

FOLLOWS = "FlashInfer 0.7.4"
GET = "pip download --no-deps flashinfer-python==0.7.4 -d DIR"
VARIANTS = ENGINE_VARIANTS["flashinfer"]
TRITON_MEMBER = "flashinfer/triton/kernels/cascade.py"
TRITON_NAMES = ("state_merge", "state_normalize", "state_get_lse", "merge_state_kernel",
                "merge_states_kernel")
PRELUDE = """import torch
import triton
import triton.language as tl
"""
_BASE_2 = "merge_states has no base parameter: its LSEs are base 2"
TRITON_ENVELOPE = Envelope(bases=("2",), said={"bases": _BASE_2})
CUDA_ENVELOPE = Envelope(head_dims="power of two", bases=("2",), said={
    "bases": _BASE_2, "head_dims": "DISPATCH_HEAD_DIM: Unsupported head_dim (64, 128, 256, "
                                   "512 only)"})


class _TritonCascade:
    """FlashInfer's Triton cascade kernels, launched as flashinfer/triton/cascade.py does."""

    def __init__(self, kernels):
        self.kernels = kernels

    @staticmethod
    def _check(tensors, dims):
        for t, d in zip(tensors, dims):
            if not t.is_contiguous():
                raise ValueError(f"a {tuple(t.shape)} tensor of strides {tuple(t.stride())} "
                                 "must be contiguous (FlashInfer's check_input)")
            if t.dim() != d:
                raise ValueError(f"a {tuple(t.shape)} tensor must be a {d}D tensor "
                                 "(FlashInfer's check_dim)")
        if len({t.device for t in tensors}) != 1:
            raise ValueError("all tensors must be on the same device (FlashInfer's "
                             "check_device)")

    def merge_states(self, v, s):
        self._check((v, s), (4, 3))
        if v.shape[:3] != s.shape:
            raise ValueError(f"v {tuple(v.shape)} and s {tuple(s.shape)} disagree "
                             "(FlashInfer's merge_states)")
        seq_len, num_index_sets, num_heads, head_dim = v.shape
        s = s.to(torch.float32)
        v_merged = torch.empty((seq_len, num_heads, head_dim), dtype=v.dtype, device=v.device)
        s_merged = torch.empty((seq_len, num_heads), dtype=s.dtype, device=s.device)
        self.kernels.merge_states_kernel[(seq_len,)](
            v, s, v_merged, s_merged, num_index_sets, num_heads, head_dim, bdx=head_dim,
            bdy=num_heads)
        return v_merged, s_merged

    def merge_state(self, v_a, s_a, v_b, s_b):
        self._check((v_a, s_a, v_b, s_b), (3, 2, 3, 2))
        if v_a.shape != v_b.shape or s_a.shape != s_b.shape or v_a.shape[:2] != s_a.shape:
            raise ValueError(f"states {tuple(v_a.shape)}, {tuple(s_a.shape)}, "
                             f"{tuple(v_b.shape)}, {tuple(s_b.shape)} disagree (FlashInfer's "
                             "merge_state)")
        s_a = s_a.to(torch.float32)
        s_b = s_b.to(torch.float32)
        seq_len, num_heads, head_dim = v_a.shape
        v_merged = torch.empty_like(v_a).to(s_a.device)
        s_merged = torch.empty((seq_len, num_heads)).to(s_a.device)
        self.kernels.merge_state_kernel[lambda meta: (seq_len,)](
            v_a, s_a, v_b, s_b, v_merged, s_merged, num_heads, head_dim, bdx=head_dim,
            bdy=num_heads)
        return v_merged, s_merged


def _base_2_only(is_lse_base_on_e):
    if is_lse_base_on_e:
        raise Unsupported(f"base-e LSEs: FlashInfer's {_BASE_2}")


class Cascade:
    """``merge`` through FlashInfer's merge_states (variant ``cascade``)."""

    def __init__(self, ops, engine, envelope):
        self.OPS, self.ENGINE, self.ENVELOPE = ops, engine, envelope

    def merge(self, outs, lses, is_lse_base_on_e=True, return_lse=False):
        _base_2_only(is_lse_base_on_e)
        if outs.dim() == 4 and lses.dim() == 3:  # FlashInfer's layout: the partials second
            outs, lses = outs.transpose(0, 1).contiguous(), lses.transpose(0, 1).contiguous()
        out, lse = self.OPS.merge_states(outs, lses)
        return (out, lse) if return_lse else out


class MergeStateChain(Cascade):
    """``merge`` as FlashInfer's pairwise merge_state chained over the partials (variant
    ``merge_state``)."""

    def merge(self, outs, lses, is_lse_base_on_e=True, return_lse=False):
        _base_2_only(is_lse_base_on_e)
        if outs.dim() != 4 or lses.dim() != 3 or outs.shape[0] < 2:
            raise Unsupported(f"outs {tuple(outs.shape)}, lses {tuple(lses.shape)}: a chain of "
                              "FlashInfer's pairwise merge_state needs 2 or more [B, H, D] "
                              "partials")
        out, lse = outs[0], lses[0]
        for i in range(1, outs.shape[0]):
            out, lse = self.OPS.merge_state(out, lse, outs[i], lses[i])
        return (out, lse) if return_lse else out


class FusedA2A:
    """FlashInfer's fused exchange + merge (variant ``a2a``)."""

    SURFACES = ("exchange",)  # its lse_reduce accepts the contract's "no mask" only

    ENVELOPE = Envelope(world_sizes="at least 2", said={
        "world_sizes": "decode_cp_a2a_lse_reduce_create_workspace rendezvouses over the "
                       "group's process group"})

    def __init__(self, comm, engine):
        self.OPS, self.ENGINE = comm, engine
        self._workspaces = {}

    def _workspace(self, group, rows, local_heads, head_dim, dtype):
        key = (id(group.device_group), local_heads, head_dim, dtype)
        have = self._workspaces.get(key)
        if have is None or have[0] < rows:  # every rank makes the same call: collective
            rows = max(16, 1 << max(rows - 1, 0).bit_length())
            ws = self.OPS.decode_cp_a2a_lse_reduce_create_workspace(
                rows, local_heads, group.world_size, head_dim, dtype, group.device_group)
            have = self._workspaces[key] = (rows, ws)
        return have[1]

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        if seq_lens is not None or query_start_loc is not None:
            raise Unsupported("seq_lens / query_start_loc: FlashInfer's "
                              "decode_cp_a2a_lse_reduce takes no masks")
        n = group.world_size
        if n < 2 or group.device_group is None:
            raise Unsupported("a group of one: FlashInfer's workspace is a symmetric-memory "
                              "rendezvous over the group's process group")
        if return_lse:
            raise Unsupported("an LSE from FlashInfer's decode_cp_a2a_lse_reduce: it returns "
                              "none")
        b, h, d = out.shape
        if h % n:
            raise Unsupported(f"{h} heads over {n} ranks: FlashInfer's [B, H/N, N, D] layout "
                              "has no place for them")
        partial_o = out.unflatten(1, (n, h // n)).transpose(1, 2).contiguous()
        partial_lse = lse.unflatten(1, (n, h // n)).transpose(1, 2).contiguous()
        ws = self._workspace(group, b, h // n, d, out.dtype)
        return self.OPS.decode_cp_a2a_lse_reduce(partial_o, partial_lse, ws,
                                                 group.rank_in_group, n,
                                                 lse_mode="basee" if is_lse_base_on_e
                                                 else "base2")


def _triton(source):
    release = _release.Release(source)
    kernels = _release.load(release, [_release.Part(TRITON_MEMBER, TRITON_NAMES)],
                            prelude=PRELUDE, tag="flashinfer_cascade")
    return _TritonCascade(kernels), release


def adapter(variant=None, source=None):
    """The implementation object of ``--impl flashinfer[:VARIANT][=PATH]``."""
    variant = pick_variant("flashinfer", variant, VARIANTS)
    cls = MergeStateChain if variant == "merge_state" else Cascade
    if variant == "a2a":
        refuse_release("flashinfer:a2a", source, "decode_cp_a2a_lse_reduce is FlashInfer's "
                       "compiled CUDA op")
        require_gpus("flashinfer:a2a", GPUS_NEEDED[("flashinfer", "a2a")],
                     "decode_cp_a2a_lse_reduce exchanges over NCCL symmetric memory")
    if source is not None:
        ops, release = _triton(source)
        version = release.version()
        return cls(ops, f"FlashInfer {version or '(version unknown)'} ({release.describe()}; "
                        "its Triton cascade kernels)", TRITON_ENVELOPE)
    root = installed_root("flashinfer", "FlashInfer", GET)
    version = installed_version("flashinfer-python")
    if variant == "a2a":
        import importlib

        comm = importlib.import_module("flashinfer.comm.dcp_lse_reduce")
        return FusedA2A(comm, f"FlashInfer {version} (installed at {root})")
    if cuda_gpus():
        import importlib

        fi = importlib.import_module("flashinfer")
        return cls(fi, f"FlashInfer {version} (installed at {root}; its CUDA kernels)",
                   CUDA_ENVELOPE)
    ops, _ = _triton(root.parent)
    return cls(ops, f"FlashInfer {version} (installed at {root}; no CUDA here: its Triton "
                    "cascade kernels)", TRITON_ENVELOPE)
