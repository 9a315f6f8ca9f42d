"""``--impl sglang[:VARIANT][=PATH]``: SGLang's DCP combine (it follows SGLang 0.5.23:
``sglang/kernels/ops/attention/dcp_kernels.py`` and ``sglang/srt/layers/dcp/comm.py``),
installed here or read from its release.

Variants (``a2a`` is the default):

``a2a``
    SGLang's packed all-to-all, its kernels called as its own ``dcp_a2a_lse_reduce`` calls
    them: output and fp32 LSE share one ``[N, B, H/N, D + P]`` buffer, the output in lanes
    ``[:D]`` and the LSE in the float32 word ``D // P``::

        lse_pack_dim(dtype)          -> _lse_pack_dim(dtype)
        pack_send(out, lse, send, N, H/N, D, P)
                                     -> dcp_pack_a2a_send(out, lse, send[..., :D],
                                                          send.view(float32)[..., D // P])
        unpack_combine(recv, D, P, return_lse, base_e)
                                     -> dcp_lse_combine_triton(recv[..., :D],
                                            recv.view(float32)[..., D // P], base_e, return_lse)
        merge(outs, lses, base_e, return_lse)
                                     -> dcp_lse_combine_triton(outs, lses, base_e, return_lse)
        lse_reduce(out, lse, group, *, is_lse_base_on_e)
                                     -> dcp_a2a_lse_reduce(out, lse, COORD, is_lse_base_on_e,
                                                           comm_backend="a2a")

    SGLang's pack reads N and H/N off its destination buffers, and neither of its kernels
    takes D or P: a ``pack_send`` whose ``world_size`` / ``h_per_rank`` disagree with its send
    buffer, or a ``head_dim`` / ``lse_pack_dim`` that does not describe the row (D + P lanes,
    P of the row's dtype), cannot be expressed (not applicable). Its reduce returns no LSE (``return_lse=True``: not applicable) and takes no
    masks. ``COORD`` is the contract's group seen as SGLang's GroupCoordinator
    (:mod:`._coordinators`); its shortcut for a group of one (the input itself) stays visible.

``ag_rs_mha``
    ``lse_reduce`` -> ``cp_lse_ag_out_rs_mha(out, lse, COORD, return_lse)``: torch's
    logsumexp, all-reduce, head slice. Base e only (it has no base parameter: base 2 is not
    applicable). It scales the caller's ``out`` in place (``nan_to_num_``, ``mul_``), as SGLang
    does.

``ag_rs_mla``
    ``lse_reduce`` -> ``cp_lse_ag_out_rs_mla(out, lse, COORD, ctx=None, is_lse_base_on_e)``,
    then ``.transpose(0, 1)`` as SGLang's MLA forward does (the op returns ``[H/N, B, D]``).
    No LSE is returned (not applicable).

``fi_a2a``
    ``lse_reduce`` -> ``dcp_a2a_lse_reduce(..., comm_backend="fi_a2a")``: the exchange through
    FlashInfer's MNNVL all-to-all (``init_fi_a2a_workspace`` once per group). Installed SGLang
    and FlashInfer on 2 or more Blackwell GPUs only. SGLang's workspace init reads the
    server's parallel layout (``get_parallel()``: tp, pp, nnodes) for its support check
    alone; the adapter answers it with the DCP group alone on one node (tp 1, pp 1, 1 node)
    while the init runs, which decides nothing about the exchange or the merge.

The release form (``=PATH``: the wheel, ``pip download --no-deps sglang==0.5.23 -d DIR``, an
unpacked tree, or one of the two files inside such a tree) reads the named functions and
kernels from the two files (:mod:`._release`); comm.py's own imports (SGLang's runtime) are
not run. The one engine utility its functions use, ``use_symmetric_memory(group)`` (in
``cp_lse_ag_out_rs_mla``), is replaced by a context that does nothing: SGLang's own returns
exactly that (``nullcontext``) unless the server enabled NCCL symmetric memory, and even then
it only picks the pool the tensors are allocated from, never their values.
``fi_a2a`` has no release form (its workspace init needs SGLang's runtime and FlashInfer).
Releases before 0.5.18 (0.5.17 read) have ``dcp_lse_combine_triton`` and
``dcp_a2a_lse_reduce`` but no ``dcp_pack_a2a_send``: the a2a variant then exposes the merge and
the exchange, and its wire clauses are not applicable.

Envelope: SGLang's merge kernel takes power-of-two head dims only (``tl.arange(0,
HEAD_DIM)``); its pack refuses non-float32 LSEs (ValueError) and, for 16-bit outputs, an odd
head dim (ValueError: D must be a multiple of the LSE pack dim; a packed row of odd D + 2
16-bit lanes has no float32 word for the LSE, which torch's view refuses first, as in SGLang's
own ``dcp_a2a_lse_reduce``). Its pack also views the output as float32 words, so an output
whose last dim is strided or starts at an odd 16-bit offset is refused by torch's view. ``ag_rs_mla`` also needs a
power-of-two group size (``N_ROUNDED`` is the group size), which the envelope cannot say yet.
"""

from __future__ import annotations

import contextlib

import torch

from ..surfaces import Envelope, Unsupported
from . import ENGINE_VARIANTS, GPUS_NEEDED, _release
from ._common import import_names, installed_root, installed_version, pick_variant, \
    refuse_release, require_gpus
from ._coordinators import SglangCoordinator

KERNELS, COMM = "sglang.kernels.ops.attention.dcp_kernels", "sglang.srt.layers.dcp.comm"
KERNELS_MEMBER = "sglang/kernels/ops/attention/dcp_kernels.py"
COMM_MEMBER = "sglang/srt/layers/dcp/comm.py"
FOLLOWS = "SGLang 0.5.23"
GET = "pip download --no-deps sglang==0.5.23 -d DIR"
VARIANTS = ENGINE_VARIANTS["sglang"]

_MERGE = ("_lse_pack_dim", "_dcp_lse_combine_kernel", "dcp_lse_combine_triton")
_PACK = ("_dcp_pack_a2a_send_kernel", "dcp_pack_a2a_send")  # from 0.5.18 on
_CORRECT = ("_correct_attn_cp_out_kernel", "CPTritonContext", "correct_attn_out")
# (names from dcp_kernels.py, names from comm.py, names from dcp_kernels.py read where the
# release defines them) each variant reads
NAMES = {
    "a2a": (_MERGE, ("dcp_a2a_lse_reduce",), _PACK),
    "ag_rs_mha": ((), ("_ag_lse", "cp_lse_ag_out_rs_mha"), ()),
    "ag_rs_mla": (_CORRECT, ("_ag_lse", "cp_lse_ag_out_rs_mla"), ()),
    "fi_a2a": (_MERGE + _PACK, ("init_fi_a2a_workspace", "dcp_a2a_lse_reduce",
                                "_dcp_fi_a2a_lse_reduce"), ()),
}
# comm.py's annotations name SGLang's GroupCoordinator: lazy annotations never look it up
PRELUDE = """from __future__ import annotations

from contextlib import nullcontext as _nullcontext
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl


def use_symmetric_memory(group_coordinator, disabled=False):
    # stand-in for SGLang's allocator context (see dcp_a2a.testing.adapters.sglang)
    return _nullcontext()
"""

_SAID = {
    "head_dims": "Triton: arange's range must be a power of 2 (tl.arange(0, HEAD_DIM) in "
                 "_dcp_lse_combine_kernel); for 16-bit outputs an odd D has no float32 LSE "
                 "word in its D + 2 lanes (torch: size must be divisible by 2 to view as "
                 "Float, as in SGLang's dcp_a2a_lse_reduce) and dcp_pack_a2a_send refuses it "
                 "(ValueError: head dim must be a multiple of the LSE pack dim)",
    "lse_dtypes": "dcp_pack_a2a_send: ValueError LSE tensors must be float32",
    "min_head_dim": "for 16-bit outputs D = 1 has no float32 LSE word in its D + 2 lanes "
                    "(torch: size must be divisible by 2 to view as Float)",
}
PACKED = Envelope(head_dims="power of two", min_head_dim=2, lse_dtypes=("float32",),
                  said=_SAID)
POW2 = Envelope(head_dims="power of two", said={"head_dims": _SAID["head_dims"].split(";")[0]})
# the merge and the wire row of a release without the pack: no pack, so no LSE-dtype limit
UNPACKED = Envelope(head_dims="power of two", min_head_dim=2, said={
    "head_dims": _SAID["head_dims"].split(";")[0], "min_head_dim": _SAID["min_head_dim"]})


class _Ops:
    """The functions of both files, as one namespace."""

    def __init__(self, *modules):
        for m in modules:
            for k, v in vars(m).items():
                if not k.startswith("__"):
                    setattr(self, k, v)


def _installed(variant):
    root = installed_root("sglang", "SGLang", GET)
    version = installed_version("sglang")
    knames, cnames, _ = NAMES[variant]
    kernels = import_names(KERNELS, knames, f"SGLang {version}", FOLLOWS)
    comm = import_names(COMM, cnames, f"SGLang {version}", FOLLOWS)
    ops = _Ops(kernels, comm)
    ops.COMM = comm
    return ops, f"SGLang {version} (installed at {root})"


def _from_release(variant, source):
    release = _release.Release(source)
    knames, cnames, optional = NAMES[variant]
    parts = [_release.Part(KERNELS_MEMBER, knames, optional)] if knames else []
    parts.append(_release.Part(COMM_MEMBER, cnames))
    module = _release.load(release, parts, prelude=PRELUDE, tag=f"sglang_{variant}")
    ops = _Ops(module)
    ops.COMM = module
    version = release.version()
    return ops, f"SGLang {version or '(version unknown)'} ({release.describe()})"


class _Engine:
    # SGLang takes no masks: its functions accept the contract's "no mask" (None) only, so
    # the parameters do not mean the masking surface
    SURFACES = ("exchange",)

    def __init__(self, ops, engine: str):
        self.OPS = ops
        self.ENGINE = engine


def _no_masks(fn: str, seq_lens, query_start_loc):
    if seq_lens is not None or query_start_loc is not None:
        raise Unsupported(f"seq_lens / query_start_loc: SGLang's {fn} takes no masks")


class A2A(_Engine):
    """SGLang's packed all-to-all (variant ``a2a``)."""

    ENVELOPE = PACKED
    SURFACES = ("merge", "wire", "exchange")

    def lse_pack_dim(self, dtype):
        return self.OPS._lse_pack_dim(dtype)

    def _row(self, buf, head_dim, lse_pack_dim):
        """SGLang takes the output lanes and the LSE word as two views of the row, built here
        from ``head_dim`` and ``lse_pack_dim``: values that do not describe the row (its
        dtype's pack dim, D + P lanes) have no counterpart in its API."""
        try:
            own = self.OPS._lse_pack_dim(buf.dtype)
        except Exception:  # a dtype SGLang has no pack dim for: its own view refuses it
            return
        if lse_pack_dim != own or (buf.dim() >= 1 and buf.shape[-1] != head_dim + own):
            raise Unsupported(f"head_dim={head_dim}, lse_pack_dim={lse_pack_dim} for a "
                              f"{str(buf.dtype).replace('torch.', '')} row of "
                              f"{buf.shape[-1] if buf.dim() else 0} lanes: SGLang takes neither, "
                              f"it reads the output lanes and the LSE word ({own} lanes) as two "
                              "views of the row")

    def pack_send(self, out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                  seq_lens=None, query_start_loc=None):
        _no_masks("dcp_pack_a2a_send", seq_lens, query_start_loc)
        if send.dim() == 4 and (world_size, h_per_rank) != (send.shape[0], send.shape[2]):
            raise Unsupported(f"world_size={world_size}, h_per_rank={h_per_rank} with a send "
                              f"buffer of {send.shape[0]} peers x {send.shape[2]} heads: "
                              "SGLang's dcp_pack_a2a_send reads both off its buffers")
        self._row(send, head_dim, lse_pack_dim)
        send_words = send.view(torch.float32)
        self.OPS.dcp_pack_a2a_send(out, lse, send[..., :head_dim],
                                   send_words[..., head_dim // lse_pack_dim])

    def _lse_words(self, recv, head_dim, lse_pack_dim):
        """The received LSEs as this release's reduce hands them to its merge: a view."""
        return recv.view(torch.float32)[..., head_dim // lse_pack_dim]

    def unpack_combine(self, recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
        self._row(recv, head_dim, lse_pack_dim)
        out, lse = self.OPS.dcp_lse_combine_triton(
            recv[..., :head_dim], self._lse_words(recv, head_dim, lse_pack_dim),
            is_lse_base_on_e=is_lse_base_on_e, return_lse=return_lse)
        return (out, lse) if return_lse else out

    def merge(self, outs, lses, is_lse_base_on_e=True, return_lse=False):
        out, lse = self.OPS.dcp_lse_combine_triton(outs, lses, is_lse_base_on_e=is_lse_base_on_e,
                                                   return_lse=return_lse)
        return (out, lse) if return_lse else out

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        _no_masks("dcp_a2a_lse_reduce", seq_lens, query_start_loc)
        if return_lse:
            raise Unsupported("an LSE from SGLang's dcp_a2a_lse_reduce: it returns none")
        return self.OPS.dcp_a2a_lse_reduce(out, lse, SglangCoordinator(group),
                                           is_lse_base_on_e=is_lse_base_on_e,
                                           comm_backend="a2a")


class A2AWithoutPack(A2A):
    """Variant ``a2a`` of a release before 0.5.18: SGLang's merge and its exchange (which
    packs the wire with torch copies), no pack kernel. The merge is judged through
    ``dcp_lse_combine_triton`` itself, inside its kernel's envelope and the wire row's (a
    16-bit row needs D >= 2 for its LSE word); the pack's float32-LSE limit is not this
    release's."""

    ENVELOPE = UNPACKED
    SURFACES = ("merge", "exchange")
    pack_send = None  # not a function of this release's contract

    def __init__(self, ops, engine: str):
        super().__init__(ops, engine + "; this release has no dcp_pack_a2a_send")

    def _lse_words(self, recv, head_dim, lse_pack_dim):
        # its dcp_a2a_lse_reduce copies the received LSE words into a contiguous float32
        # buffer before the merge (its kernel writes the merged LSE at the input LSE's
        # strides); the output lanes still go as a view
        return super()._lse_words(recv, head_dim, lse_pack_dim).contiguous()


class AgRsMha(_Engine):
    """SGLang's MHA all-gather combine (variant ``ag_rs_mha``)."""

    ENVELOPE = Envelope(bases=("e",), said={
        "bases": "cp_lse_ag_out_rs_mha has no base parameter: torch.logsumexp and exp"})

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        _no_masks("cp_lse_ag_out_rs_mha", seq_lens, query_start_loc)
        if not is_lse_base_on_e:
            raise Unsupported("base-2 LSEs: cp_lse_ag_out_rs_mha has no base parameter "
                              "(natural-log logsumexp only)")
        return self.OPS.cp_lse_ag_out_rs_mha(out, lse, SglangCoordinator(group),
                                             return_lse=return_lse)


class AgRsMla(_Engine):
    """SGLang's MLA all-gather + reduce-scatter combine (variant ``ag_rs_mla``)."""

    ENVELOPE = POW2

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        _no_masks("cp_lse_ag_out_rs_mla", seq_lens, query_start_loc)
        if return_lse:
            raise Unsupported("an LSE from SGLang's cp_lse_ag_out_rs_mla: it returns none")
        merged = self.OPS.cp_lse_ag_out_rs_mla(out, lse, SglangCoordinator(group), ctx=None,
                                               is_lse_base_on_e=is_lse_base_on_e)
        if group.world_size == 1:  # its shortcut returns the input, already [B, H, D]
            return merged
        return merged.transpose(0, 1)


class FiA2A(_Engine):
    """SGLang's exchange through FlashInfer's MNNVL all-to-all (variant ``fi_a2a``)."""

    ENVELOPE = PACKED

    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        _no_masks("dcp_a2a_lse_reduce", seq_lens, query_start_loc)
        if return_lse:
            raise Unsupported("an LSE from SGLang's dcp_a2a_lse_reduce: it returns none")
        coord = SglangCoordinator(group)
        comm = self.OPS.COMM
        if group.world_size > 1 and comm._FI_A2A_STATE is None:
            with _one_node_layout(comm, group.world_size):
                comm.init_fi_a2a_workspace(coord)
        return comm.dcp_a2a_lse_reduce(out, lse, coord, is_lse_base_on_e=is_lse_base_on_e,
                                       comm_backend="fi_a2a")


@contextlib.contextmanager
def _one_node_layout(comm, dcp_size: int):
    """SGLang's ``get_parallel()`` answered, while the fi_a2a workspace is set up, with the
    DCP group alone on one node: the only fields its support check reads."""
    from types import SimpleNamespace

    layout = SimpleNamespace(tp_size=1, pp_size=1, nnodes=1, dcp_size=dcp_size)
    saved = comm.get_parallel
    comm.get_parallel = lambda: layout
    try:
        yield
    finally:
        comm.get_parallel = saved


_CLASSES = {"a2a": A2A, "ag_rs_mha": AgRsMha, "ag_rs_mla": AgRsMla, "fi_a2a": FiA2A}


def adapter(variant=None, source=None):
    """The implementation object of ``--impl sglang[:VARIANT][=PATH]``."""
    variant = pick_variant("sglang", variant, VARIANTS)
    if variant == "fi_a2a":
        refuse_release("sglang:fi_a2a", source, "its workspace init needs SGLang's runtime and "
                       "FlashInfer")
        require_gpus("sglang:fi_a2a", GPUS_NEEDED[("sglang", "fi_a2a")],
                     "FlashInfer's MNNVL all-to-all, Blackwell GPUs in one NVLink domain")
    ops, engine = _from_release(variant, source) if source is not None else _installed(variant)
    if variant == "a2a" and not all(hasattr(ops, n) for n in _PACK):
        return A2AWithoutPack(ops, engine)
    return _CLASSES[variant](ops, engine)
