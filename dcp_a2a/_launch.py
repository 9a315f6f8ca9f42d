"""Host-side helpers shared by the kernel wrappers: device checks, block sizes, aliasing."""

from __future__ import annotations

import math

import torch

from . import _env
from .wire import BITS_DTYPE


def require_runnable_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and not _env.INTERPRET:
        raise ValueError(
            "CPU tensors need the Triton interpreter: unset TRITON_INTERPRET (dcp_a2a then "
            "enables it on machines without CUDA) or set TRITON_INTERPRET=1 before importing "
            "dcp_a2a; or use the pure-PyTorch implementation in `reference`"
        )


def bits(t: torch.Tensor) -> torch.Tensor:
    """The same memory as an integer tensor of the same width (strides unchanged)."""
    return t.view(BITS_DTYPE[t.dtype])


def as_words(t: torch.Tensor):
    """A 16-bit tensor (last dim even, unit stride, even strides and offset) as int32 words
    (pairs of adjacent lanes), or None when it cannot be viewed so."""
    if t.element_size() != 2 or t.shape[-1] % 2 or (t.numel() and t.stride(-1) != 1):
        return None
    try:
        return t.view(torch.int32)
    except RuntimeError:
        return None


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def search_steps(num_seqs: int) -> int:
    return 0 if num_seqs <= 1 else math.ceil(math.log2(num_seqs))


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte] that ``t`` can touch."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
    return (t.data_ptr(), t.data_ptr() + extent * t.element_size())


def require_disjoint(dst_name: str, dst: torch.Tensor, **sources: torch.Tensor) -> None:
    """A kernel that writes ``dst`` while reading ``sources`` must not see them overlap.

    Staging buffers carved from the same workspace as the attention output they pack made the
    pack kernel overwrite its own input in a shipped engine; refuse it here instead.
    """
    if dst.numel() == 0 or dst.device.type == "meta":
        return
    d0, d1 = _span(dst)
    for name, src in sources.items():
        if src is None or src.numel() == 0 or src.device != dst.device:
            continue
        s0, s1 = _span(src)
        if d0 < s1 and s0 < d1:
            raise ValueError(
                f"{dst_name} overlaps {name} in memory ({dst_name} bytes [{d0:#x}, {d1:#x}), "
                f"{name} bytes [{s0:#x}, {s1:#x})): a staging buffer must not alias the "
                "tensors it is built from"
            )
