"""Host-side helpers of the kernel launchers: integer views of the same memory, block sizes."""

from __future__ import annotations

import math

import torch

from ..wire import BITS_DTYPE, reach


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


def prev_pow2(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (max(1, n).bit_length() - 1)


def search_steps(num_seqs: int) -> int:
    """Steps of the binary search for a row's request over ``num_seqs`` requests."""
    return 0 if num_seqs <= 1 else math.ceil(math.log2(num_seqs))


def needs_int64(*tensors: torch.Tensor) -> bool:
    """Whether an element offset from any of these tensors' first element can reach 2^31 (the
    kernels then index in int64; int32 otherwise). Shapes and strides decide it, not the
    storage: the kernels index from each tensor's own address, and a verdict that depends on
    nothing else can be kept per problem (``dcp_a2a.ops``)."""
    for t in tensors:  # a loop, not any(<generator>): this runs on every first call
        if reach(t) >= 1 << 31:
            return True
    return False


PLANS_MAX = 4096  # launches a launcher keeps (distinct batch sizes); then it starts again


def cached_plan(cache: dict, cfg, key: tuple, build):
    """``build()``'s (grid, constexpr keywords) of one launch, from ``cache`` where it was built
    for ``key`` under this very ``cfg``: the Launch that ``tuning.launch`` returns is the same
    object while the table in force is unchanged, so a swapped table or an override (a new
    object) builds again. Built once per problem instead of on every eager call;
    callers must not change the keywords they get."""
    hit = cache.get(key)
    if hit is not None and hit[0] is cfg:
        return hit[1]
    plan = build()
    if len(cache) >= PLANS_MAX:
        cache.clear()
    cache[key] = (cfg, plan)
    return plan
