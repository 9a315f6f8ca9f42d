"""The cases of the accuracy job: which shapes, and what every rank's partial of a case is.

Every rank regenerates every rank's partial from the seed (rank n's partial comes from the
generator seeded (seed, case, n)), keeps its own as its input and all ranks' slices of its heads
[r*H/N, (r+1)*H/N) for the oracle, so no input travels through the collectives under test.
From B = 3 on a case is an engine's batch, not just random partials (:func:`case_layout`):
requests of one query row and one of two (a speculative step), a padding row at the end, and on
some ranks an empty local KV shard for a request, whose rows carry a NaN partial under a finite
LSE, as attention over no keys leaves them. With a 16-bit output dtype the base-2 cases hand
the LSE over in that dtype (widened by value, as the contract says).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from . import args as a

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Decode shapes of the upstream change (B in {1, 16, 128}, H = 128, D = 512), its
# microbenchmark shape (B = 8192, H = 64, D = 512, bfloat16), and a head dim that is not a power
# of two (80: every other default is 512, which a kernel assuming one would pass).
GPU_SHAPES = "1x128x512,16x128x512,128x128x512,8192x64x512:bfloat16,64x32x80"
# Triton runs interpreted on CPU (~0.1-1 s per call and rank): the B = 1 decode shape plus
# small ones, including a head dim that is not a power of two.
CPU_SHAPES = "1x128x512,4x24x40,16x24x64"
INPUTS = ("from B = 3 each case is a batch: decode requests (one of two query rows), a padding "
          "row, empty local KV shards on some ranks (NaN partials, finite LSEs) masked through "
          "seq_lens/query_start_loc; base-2 cases of 16-bit dtypes hand the LSE over in the "
          "output dtype")
# an implementation that takes no seq_lens gets batches without masked rows
INPUTS_UNMASKED = ("one request a row, every row merging every rank (the implementation under "
                   "test takes no seq_lens/query_start_loc); base-2 cases of 16-bit dtypes hand "
                   "the LSE over in the output dtype")


@dataclass(frozen=True)
class Shape:
    b: int
    h: int
    d: int
    dtype: str | None = None   # only run for this dtype

    def __str__(self):
        return f"{self.b}x{self.h}x{self.d}"


SHAPES = a.shapes("BxHxD", dtypes=tuple(DTYPES), example="16x128x512")


def shape_list(value: str) -> list[Shape]:
    """argparse type of ``--shapes``: a comma list of distinct BxHxD[:dtype]."""
    return [Shape(*dims, dt) for dims, dt in SHAPES(value)]


def parse_shapes(spec: str) -> list[Shape]:
    """``--shapes``' value as Shapes; ValueError naming what is wrong."""
    try:
        return shape_list(spec)
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None


def resolve_shapes(shapes: list[Shape] | str | None, world_size: int, gpu: bool):
    """(shapes to run, default shapes skipped because H % world_size != 0). An explicit
    ``shapes`` list with such a shape is an error; the default sweep just leaves it out."""
    explicit = shapes is not None
    if shapes is None or isinstance(shapes, str):
        shapes = parse_shapes(shapes or (GPU_SHAPES if gpu else CPU_SHAPES))
    bad = [str(s) for s in shapes if s.h % world_size]
    if bad and explicit:
        raise ValueError(f"shapes {', '.join(bad)}: H is not divisible by the world size "
                         f"{world_size}")
    return [s for s in shapes if s.h % world_size == 0], bad


def case_bytes(shape: Shape, dtype, world: int) -> int:
    """Memory one rank holds at the peak of a case, generously: the float32 draw of a partial
    and its cast, its own input, the oracle's slices of every rank (as many elements as one
    partial), the send and receive buffers and the result, and the oracle's float64 chunk."""
    from .accuracy_report import CHECK_CHUNK_ELEMENTS

    es = torch.tensor([], dtype=dtype).element_size()
    elements = shape.b * shape.h * shape.d
    per_element = 4 + 6 * es  # draw (fp32); cast, own, slices, send, recv, result
    rows = shape.b * shape.h * (4 * 8 + world * 8)  # LSEs, seq masks: small
    return elements * per_element + rows + 4 * 8 * CHECK_CHUNK_ELEMENTS


def _generator(device, *seed_parts) -> torch.Generator:
    g = torch.Generator(device=device)
    s = 0
    for part in seed_parts:
        s = (s * 1_000_003 + int(part)) % (1 << 62)
    g.manual_seed(s)
    return g


def case_layout(b: int, world: int, case: int, masking: bool = True):
    """The batch of a case, the same on every rank: ``(query_start_loc, seq_lens, masked)``,
    lists. From B = 3 on: requests of one query row, the first of two (a speculative step), a
    padding row at the end, and empty local KV shards: request ``case % R`` on rank
    ``case % N``, and every request i with (i + case) % 5 == 0 on rank (i + case) % N, so most
    rows still merge every rank. Below B = 3 (decode's B = 1), or without ``masking`` (an
    implementation that takes no masks), one request a row, nothing empty: every row merges
    every rank. ``seq_lens[n][i]``: rank n's local KV tokens of request i (0 for an empty
    shard). ``masked[n][r]``: row r carries no KV on rank n (an empty shard, or padding:
    padding is empty on every rank and merges to 0 and -inf)."""
    pad = 1 if b >= 3 and masking else 0
    rows = b - pad
    qlens = [2] + [1] * (rows - 2) if pad else [1] * rows
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    owner = [i for i, q in enumerate(qlens) for _ in range(q)] + [None] * pad
    n_req = len(qlens)
    empty = set()
    if pad:
        empty.add((case % n_req, case % world))
        empty.update((i, (i + case) % world) for i in range(n_req) if (i + case) % 5 == 0)
    seq_lens = [[0 if (i, n) in empty else 1 + (5 * i + 3 * n) % 61 for i in range(n_req)]
                for n in range(world)]
    masked = [[o is None or seq_lens[n][o] == 0 for o in owner] for n in range(world)]
    return qsl, seq_lens, masked


def lse_dtype_of(dtype, base_e: bool):
    """The dtype a case hands its LSE over in: float32, or the 16-bit output dtype in base 2."""
    return torch.float32 if base_e or dtype == torch.float32 else dtype


def rank_partial(seed, case, n, shape: Shape, dtype, spread, device):
    """Rank ``n``'s partial (out[B, H, D] in ``dtype``, lse[B, H] float32) of a case: the
    same on every rank that generates it. The per-row LSE level is common to all ranks."""
    g = _generator(device, seed, case, 1 << 20)
    level = torch.randn(shape.b, shape.h, generator=g, device=device) * 8.0 + 5.0
    g = _generator(device, seed, case, n)
    out = torch.randn(shape.b, shape.h, shape.d, generator=g, device=device).to(dtype)
    lse = level + torch.randn(shape.b, shape.h, generator=g, device=device) * spread
    return out, lse
