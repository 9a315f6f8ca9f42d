"""Launch shapes for the kernels (block sizes, warps), chosen per problem shape.

The benchmark (``python -m dcp_a2a.bench --sweep``) overrides them through ``OVERRIDES`` to time
variants in one run; docs/perf.md records what was tried and why these defaults won.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _env
from ._launch import next_pow2


@dataclass(frozen=True)
class Launch:
    block_h: int
    block_d: int
    num_warps: int
    stream: bool = False  # streaming cache hints: evict-first loads, .cs stores


OVERRIDES: dict[str, Launch] = {}


def _fit(block_h: int, heads: int) -> int:
    return max(1, min(block_h, next_pow2(heads)))


def pack_launch(batch: int, heads: int, head_dim: int) -> Launch:
    if "pack" in OVERRIDES:
        o = OVERRIDES["pack"]
        return Launch(_fit(o.block_h, heads), min(o.block_d, next_pow2(head_dim)), o.num_warps,
                      o.stream)
    block_d = min(next_pow2(head_dim), 1024)
    if _env.INTERPRET:  # numpy: bigger tiles, fewer programs
        return Launch(_fit(4096 // block_d, heads), block_d, 4)
    if batch * heads <= 1024:  # decode: many small programs for latency
        return Launch(_fit(max(1, 512 // block_d), heads), block_d, 2)
    # a whole (peer, token) slab per program: 16 heads x 256 words at D=512 bf16
    return Launch(_fit(max(1, 4096 // block_d), heads), block_d, 8)


def combine_launch(ranks: int, batch: int, heads: int, head_dim: int) -> Launch:
    if "combine" in OVERRIDES:
        o = OVERRIDES["combine"]
        return Launch(_fit(o.block_h, heads), min(o.block_d, next_pow2(head_dim)), o.num_warps,
                      o.stream)
    block_d = min(next_pow2(head_dim), 512)
    if _env.INTERPRET:
        return Launch(_fit(4096 // block_d, heads), block_d, 4)
    if batch * heads <= 256:  # decode: one head per program for latency
        return Launch(1, block_d, 8)
    block_d = min(block_d, 128)
    return Launch(_fit(max(1, 1024 // block_d), heads), block_d, 8)


def scale_launch(ranks: int, batch: int, heads: int, head_dim: int) -> Launch:
    """The AG+RS weighting kernel (a read and a write of the local output)."""
    if "scale" in OVERRIDES:
        return OVERRIDES["scale"]
    block_d = min(next_pow2(head_dim), 512)
    return Launch(_fit(max(1, 4096 // block_d), heads), block_d, 4)
