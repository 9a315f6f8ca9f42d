"""Random attention partials for the tests: every rank's out[B, H, D] and lse[B, H].

LSEs are drawn in float32 with realistic spreads (decode partials over KV shards of different
lengths differ by a few nats; some rows by tens), not only in the output dtype, so precision loss
in the LSE path cannot hide behind coarse inputs.
"""

from __future__ import annotations

import math

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def large_batch(device) -> int:
    """A batch past any row cap an implementation may carry: a buffer preallocated for the
    engine's largest batch, a grid axis of at most 65535 programs (CUDA's y and z), a 16-bit row
    index. Past 2^16 on a GPU; on the CPU, where the Triton interpreter takes 8k rows in about a
    second, 8195."""
    return (1 << 16) + 3 if torch.device(device).type == "cuda" else 8195


def guarded(shape, dtype: torch.dtype, device, *, seed: int = 0):
    """``(t, outside)``: a contiguous ``t`` of ``shape`` and ``dtype`` carved, 4096-byte aligned,
    from the middle of a workspace of random bytes (as an engine carves a staging buffer from a
    workspace next to live data), with at least ``t``'s size on either side; ``outside()`` says
    where a call since wrote the bytes around ``t`` ("N bytes after the buffer; the first at
    byte +k from its end"), or returns None."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    guard = 4096 * -(-nbytes // 4096)
    g = torch.Generator().manual_seed(seed)
    ws = torch.randint(0, 256, (2 * guard + nbytes,), dtype=torch.uint8, generator=g).to(device)
    before = ws.clone()
    t = ws[guard:guard + nbytes].view(dtype).view(shape)

    def outside():
        for side, span in (("before", slice(0, guard)), ("after", slice(guard + nbytes, None))):
            changed = torch.nonzero(ws[span] != before[span]).flatten()
            if changed.numel():
                first = int(changed[0]) - (guard if side == "before" else 0)
                edge = "start" if side == "before" else "end"
                return (f"{changed.numel()} bytes {side} the buffer; the first at byte "
                        f"{first:+d} from its {edge}")
        return None

    return t, outside


def partials(n: int, b: int, h: int, d: int, dtype: torch.dtype, *, seed: int = 0,
             spread: float = 4.0, out_scale: float = 1.0, device="cpu"):
    """(outs[N, B, H, D] in ``dtype``, lses[N, B, H] float32) with a per-row offset and
    per-rank spread; ``spread`` is the std of the LSE differences between ranks."""
    g = torch.Generator().manual_seed(seed)
    outs = (torch.randn(n, b, h, d, generator=g) * out_scale).to(dtype)
    base = torch.randn(1, b, h, generator=g) * 8.0 + 5.0
    lses = (base + torch.randn(n, b, h, generator=g) * spread).to(torch.float32)
    return outs.to(device), lses.to(device)


def poison_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor shaped like ``t`` full of NaN (float) or a sentinel (int): kernels must
    overwrite every element they own."""
    if t.dtype.is_floating_point:
        return torch.full_like(t, float("nan"))
    return torch.full_like(t, -0x5A5A)


def snapshot(**tensors) -> dict:
    """{name: (tensor, copy)} of the caller's tensors (None skipped), taken before a call that
    must give them back unchanged: :func:`modified` names those it changed."""
    return {k: (t, t.detach().clone()) for k, t in tensors.items()
            if isinstance(t, torch.Tensor)}


def modified(snap: dict) -> list[str]:
    """Names of the :func:`snapshot` tensors whose bits changed (compared as integers, so a NaN
    left in place counts as unchanged and a -0.0 written over 0.0 as changed)."""
    def bits(t):
        return bits_view(t) if t.dtype.is_floating_point else t
    return [k for k, (t, before) in snap.items() if not torch.equal(bits(t), bits(before))]


def assert_unmodified(snap: dict, by: str) -> None:
    """AssertionError naming the :func:`snapshot` tensors that the call ``by`` changed."""
    from .verdicts import Defect

    changed = modified(snap)
    if changed:  # the engine still owns them: a defect in any test, conventions' included
        raise Defect(f"{by} modified the caller's {', '.join(changed)}")


def bits_view(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def heads_of(rank: int, world_size: int, heads: int) -> slice:
    """The global heads [r*H/N, (r+1)*H/N) that rank r owns after the exchange."""
    hpr = heads // world_size
    return slice(rank * hpr, (rank + 1) * hpr)
