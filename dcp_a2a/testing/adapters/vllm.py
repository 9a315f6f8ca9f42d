"""``--impl vllm[:VARIANT][=PATH]``: vLLM's DCP combine (it follows vLLM 0.34.0,
``vllm/v1/attention/ops/dcp.py``), installed here or read from its release.

Variants (``a2a`` is the default):

``a2a``
    The packed all-to-all, one to one::

        lse_pack_dim(dtype)                     -> _dcp_a2a_lse_pack_dim(dtype)
        pack_send(out, lse, send, N, H/N, D, P, seq_lens, query_start_loc)
                                                -> _dcp_a2a_pack_send(...)  (same arguments)
        unpack_combine(recv, D, P, return_lse, base_e, *, into)
                                                -> _dcp_a2a_unpack_combine(..., out=into)
        lse_reduce(out, lse, group, *, return_lse, is_lse_base_on_e, seq_lens,
                   query_start_loc, into)       -> dcp_a2a_lse_reduce(out, lse, COORD, ctx=None,
                                                   ..., out=into)
        lse_reduce(out, lse, group, *, w_uv=W, into, is_lse_base_on_e, seq_lens,
                   query_start_loc)             -> dcp_a2a_v_up_proj_lse_reduce(out, lse, W,
                                                   BUF, COORD, ...)

    MLA's up-projection: ``out`` is the latent ``[B, H, L]``, ``W`` is ``[H, L, V]`` (vLLM's
    layout, heads in DCP rank order), the result ``[B, H/N, V]``. vLLM writes it into a
    ``[B, H/N * V]`` buffer: ``BUF`` is ``into`` viewed so (a result buffer whose heads and
    lanes admit no such view cannot be passed: not applicable), else a new buffer. vLLM's op
    returns no LSE (``return_lse=True`` with ``w_uv``: not applicable). ``COORD`` is the
    contract's group seen as vLLM's GroupCoordinator (:mod:`._coordinators`). vLLM's
    shortcuts stay visible: a group of one returns the input itself.

``ag_rs``
    ``lse_reduce`` -> ``cp_lse_ag_out_rs(out, lse, COORD, ctx=None, return_lse,
    is_lse_base_on_e, seq_lens, query_start_loc)``: all-gather the LSEs, weight the local
    output, reduce-scatter along heads. Installed vLLM only: its kernel launches through
    vLLM's JIT warm-up launcher (``VllmTritonJitKernel``, ``kernel_launcher``), which a
    release read by name cannot supply without re-implementing vLLM internals.

``direct``
    ``lse_reduce`` -> ``DirectDCPA2AWorkspace.lse_reduce(out, lse, is_lse_base_on_e,
    seq_lens, query_start_loc)``: the symmetric-memory direct exchange (vLLM's compiled op
    ``torch.ops._C.direct_dcp_a2a_lse_reduce``). Installed vLLM on 2 or more CUDA GPUs of an
    NCCL group only; one workspace (one micro-batch slot) per group, heads, head dim and
    dtype, grown when a call has more rows. No LSE is returned (``return_lse``: not
    applicable); a group of one is outside its envelope (vLLM builds the workspace only
    inside a DCP group).

The release form (``=PATH``: the wheel, ``pip download --no-deps vllm==0.34.0 -d DIR``, an
unpacked tree, or ``dcp.py`` itself) reads the functions and kernels named in ``A2A_NAMES``
from ``vllm/v1/attention/ops/dcp.py`` (:mod:`._release`); the rest of that file, which
imports vLLM's engine, is not run.

Earlier releases: vLLM 0.30.0-0.33.0 have the same packed all-to-all without ``out=`` and
without ``dcp_a2a_v_up_proj_lse_reduce``; 0.29.0 also masks empty shards with torch before its
pack (``mask_dcp_empty_shards_``) where later releases mask in the kernel. The adapter reads its
surfaces off the release: with no ``out=`` the caller-buffer clauses are not applicable, with
no up-projection op the up-projection clauses; everything else is judged as for 0.34.0. Only
what every surface needs (``A2A_NAMES``) is required, and a function that uses a definition its
release lacks refuses the release in one line, naming it.

Envelope: vLLM's Triton kernels take power-of-two head dims only (``tl.arange(0,
HEAD_DIM)``: Triton refuses anything else, loudly). ``ag_rs`` also needs a power-of-two
group size (``N_ROUNDED`` is the group size), ``direct`` fp16/bf16 outputs; the envelope
cannot say either yet, so those refusals show as limitations.
"""

from __future__ import annotations

from ..surfaces import Envelope, Unsupported, parameters
from . import ENGINE_VARIANTS, GPUS_NEEDED, _release
from ._common import import_names, installed_root, installed_version, pick_variant, \
    refuse_release, require_gpus
from ._coordinators import VllmCoordinator

MODULE = "vllm.v1.attention.ops.dcp"
MEMBER = "vllm/v1/attention/ops/dcp.py"
FOLLOWS = "vLLM 0.34.0"
GET = "pip download --no-deps vllm==0.34.0 -d DIR"
VARIANTS = ENGINE_VARIANTS["vllm"]

# what the a2a variant reads from dcp.py (the generated module defines them in this order,
# then those of MASK_NAMES and UP_PROJECTION_NAMES the release defines)
A2A_NAMES = ("_dcp_a2a_lse_pack_dim", "_dcp_a2a_send_recv_buffers",
             "_dcp_a2a_pack_send_kernel", "_dcp_a2a_unpack_combine_kernel",
             "_dcp_a2a_pack_send", "_dcp_a2a_unpack_combine", "dcp_a2a_lse_reduce")
# the masks' helpers: 0.30.0 on check the index tensors and mask in the kernel; 0.29.0 masks
# the LSE with torch first (read where the release defines them; a release whose functions
# use one it lacks is refused, naming it)
MASK_NAMES = ("_validate_dcp_empty_shard_args", "mask_dcp_empty_shards_")
# the up-projection (0.34.0 on): read where the release defines it
UP_PROJECTION_NAMES = ("_V_UP_PROJ_FIRST_MIN_TOKENS", "dcp_a2a_v_up_proj_lse_reduce")
AG_RS_NAMES = ("cp_lse_ag_out_rs",)
DIRECT_NAMES = ("DirectDCPA2AWorkspace",)
# what the definitions of A2A_NAMES use from the file's own imports (annotations are lazy)
PRELUDE = """from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl
"""

POW2 = Envelope(head_dims="power of two", said={
    "head_dims": "Triton: arange's range must be a power of 2 (tl.arange(0, HEAD_DIM) in "
                 "_dcp_a2a_pack_send_kernel and _dcp_a2a_unpack_combine_kernel)"})


def _installed(names):
    root = installed_root("vllm", "vLLM", GET)
    version = installed_version("vllm")
    ops = import_names(MODULE, names, f"vLLM {version}", FOLLOWS)
    return ops, f"vLLM {version} (installed at {root})"


def _load_compiled_ops():
    """vLLM's compiled library, which registers ``torch.ops._C`` (vLLM's CUDA platform loads it
    at start-up; the direct op is one of its ops)."""
    import importlib

    failed = []
    for name in ("vllm._C_stable_libtorch", "vllm._C"):  # 0.34.0's name, then older releases'
        try:
            importlib.import_module(name)
            return
        except ImportError as e:
            failed.append(f"{name}: {e}")
    raise ImportError("vllm:direct needs vLLM's compiled ops (torch.ops._C."
                      f"direct_dcp_a2a_lse_reduce), which do not load: {'; '.join(failed)}")


def _from_release(source):
    release = _release.Release(source)
    ops = _release.load(release, [_release.Part(MEMBER, A2A_NAMES,
                                                MASK_NAMES + UP_PROJECTION_NAMES)],
                        prelude=PRELUDE, tag="vllm_dcp")
    missing = _release.unresolved(ops, A2A_NAMES + UP_PROJECTION_NAMES)
    if missing:
        uses = "; ".join(f"{name} uses {', '.join(names)}" for name, names in missing.items())
        raise ValueError(f"{release.describe()}: {uses}, which its {MEMBER} does not define "
                         f"(the adapter follows {FOLLOWS})")
    version = release.version()
    return ops, f"vLLM {version or '(version unknown)'} ({release.describe()})"


class A2A:
    """vLLM's packed all-to-all (variant ``a2a``)."""

    ENVELOPE = POW2

    def __init__(self, ops, engine: str):
        self.OPS = ops
        # what this release has (earlier ones lack out= and the up-projection op)
        self.masks = {"seq_lens", "query_start_loc"} <= (
            parameters(ops._dcp_a2a_pack_send) & parameters(ops.dcp_a2a_lse_reduce))
        self.out = "out" in (parameters(ops._dcp_a2a_unpack_combine)
                             & parameters(ops.dcp_a2a_lse_reduce))
        self.up_projection = all(hasattr(ops, n) for n in UP_PROJECTION_NAMES)
        self.SURFACES = frozenset({"merge", "wire", "exchange"}
                                  | ({"masking"} if self.masks else set())
                                  | ({"caller buffer"} if self.out else set())
                                  | ({"up-projection"} if self.up_projection else set()))
        lacks = [what for what, has in (
            ("seq_lens/query_start_loc", self.masks), ("out=", self.out),
            ("dcp_a2a_v_up_proj_lse_reduce", self.up_projection)) if not has]
        self.ENGINE = engine + (f"; this release has no {', no '.join(lacks)}" if lacks else "")

    def _masks(self, seq_lens, query_start_loc) -> dict:
        if seq_lens is None and query_start_loc is None:
            return {}
        if not self.masks:
            raise Unsupported("masks: this release's _dcp_a2a_pack_send and dcp_a2a_lse_reduce "
                              "take no seq_lens/query_start_loc")
        return {"seq_lens": seq_lens, "query_start_loc": query_start_loc}

    def _into(self, into) -> dict:
        if into is None:
            return {}
        if not self.out:
            raise Unsupported("a caller's result buffer: this release's _dcp_a2a_unpack_combine "
                              "and dcp_a2a_lse_reduce take no out=")
        return {"out": into}

    def lse_pack_dim(self, dtype):
        return self.OPS._dcp_a2a_lse_pack_dim(dtype)

    def pack_send(self, out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                  seq_lens=None, query_start_loc=None):
        return self.OPS._dcp_a2a_pack_send(out, lse, send, world_size, h_per_rank, head_dim,
                                           lse_pack_dim, **self._masks(seq_lens, query_start_loc))

    def unpack_combine(self, recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e, *,
                       into=None):
        return self.OPS._dcp_a2a_unpack_combine(recv, head_dim, lse_pack_dim, return_lse,
                                                is_lse_base_on_e, **self._into(into))

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None, into=None, w_uv=None):
        coord = VllmCoordinator(group)
        masks = self._masks(seq_lens, query_start_loc)
        if w_uv is None:
            return self.OPS.dcp_a2a_lse_reduce(out, lse, coord, ctx=None, return_lse=return_lse,
                                               is_lse_base_on_e=is_lse_base_on_e, **masks,
                                               **self._into(into))
        if not self.up_projection:
            raise Unsupported("the up-projection: this release defines no "
                              "dcp_a2a_v_up_proj_lse_reduce")
        if return_lse:
            raise Unsupported("an LSE from the up-projection: vLLM's "
                              "dcp_a2a_v_up_proj_lse_reduce returns none")
        result, buf = _up_projection_buffer(out, w_uv, group.world_size, into)
        self.OPS.dcp_a2a_v_up_proj_lse_reduce(out, lse, w_uv, buf, coord,
                                              is_lse_base_on_e=is_lse_base_on_e, **masks)
        return result


def _up_projection_buffer(out, w_uv, world_size, into):
    """(the contract's result [B, H/N, V], the [B, H/N * V] buffer vLLM writes it to)."""
    if into is None:
        b, h = out.shape[0], out.shape[1]
        v = w_uv.shape[-1]
        buf = out.new_empty((b, (h // world_size) * v))
        return buf.view(b, h // world_size, v), buf
    if into.dim() != 3:  # not the contract's shape: vLLM gets it as it is
        return into, into
    try:
        return into, into.view(into.shape[0], into.shape[1] * into.shape[2])
    except RuntimeError:
        raise Unsupported("a result buffer whose heads and lanes cannot be viewed as one row "
                          f"(strides {tuple(into.stride())}): vLLM's up-projection writes a "
                          "[B, H/N * V] buffer") from None


class AgRs:
    """vLLM's all-gather + reduce-scatter combine (variant ``ag_rs``)."""

    ENVELOPE = POW2

    def __init__(self, ops, engine: str):
        self.OPS = ops
        self.ENGINE = engine

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        return self.OPS.cp_lse_ag_out_rs(out, lse, VllmCoordinator(group), ctx=None,
                                         return_lse=return_lse,
                                         is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
                                         query_start_loc=query_start_loc)


class Direct:
    """vLLM's symmetric-memory direct exchange (variant ``direct``)."""

    ENVELOPE = Envelope(world_sizes="at least 2", said={
        "world_sizes": "vLLM builds the direct workspace only inside a DCP group of 2 or more "
                       "ranks"})

    def __init__(self, ops, engine: str):
        self.OPS = ops
        self.ENGINE = engine
        self._workspaces = {}

    def _workspace(self, group, out):
        n = group.world_size
        b, h, d = out.shape
        key = (id(group.device_group), h // n, d, out.dtype, out.device)
        ws = self._workspaces.get(key)
        if ws is None or ws.max_num_tokens < b:  # every rank makes the same call: collective
            rows = max(16, 1 << max(b - 1, 0).bit_length())
            ws = self.OPS.DirectDCPA2AWorkspace(group.device_group, out.device, rows, h // n, d,
                                                out.dtype, 1)
            self._workspaces[key] = ws
        return ws

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        if group.world_size < 2:
            raise Unsupported("a group of one: vLLM builds the direct workspace only inside a "
                              "DCP group of 2 or more ranks")
        if return_lse:
            raise Unsupported("an LSE from vLLM's direct op: DirectDCPA2AWorkspace.lse_reduce "
                              "returns none")
        return self._workspace(group, out).lse_reduce(out, lse, is_lse_base_on_e, seq_lens,
                                                      query_start_loc)


def adapter(variant=None, source=None):
    """The implementation object of ``--impl vllm[:VARIANT][=PATH]``."""
    variant = pick_variant("vllm", variant, VARIANTS)
    if variant == "ag_rs":
        refuse_release("vllm:ag_rs", source, "cp_lse_ag_out_rs launches its kernel through "
                       "vLLM's JIT warm-up launcher (VllmTritonJitKernel), which only an "
                       "installed vLLM provides")
        return AgRs(*_installed(AG_RS_NAMES))
    if variant == "direct":
        refuse_release("vllm:direct", source, "it runs vLLM's compiled op "
                       "torch.ops._C.direct_dcp_a2a_lse_reduce")
        require_gpus("vllm:direct", GPUS_NEEDED[("vllm", "direct")],
                     "DirectDCPA2AWorkspace exchanges through torch symmetric memory")
        ops_engine = _installed(DIRECT_NAMES)
        _load_compiled_ops()
        return Direct(*ops_engine)
    return A2A(*(_from_release(source) if source is not None else _installed(A2A_NAMES)))
