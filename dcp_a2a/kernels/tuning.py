"""Launch configurations of the kernels (block sizes, warps): a table, chosen per problem shape.

The table is fixed data, so a CUDA graph captured at one batch size replays the launch it
captured, and the tests can run every configuration the table can pick
(``every_launch``): the kernels' results are bitwise the same under each of them (no FMA
contraction, fixed summation order; see :mod:`dcp_a2a.merge_math`). The benchmark
(``python -m dcp_a2a.testing.bench --sweep``) overrides the table through ``OVERRIDES`` to time variants
in one run; docs/perf.md records what was tried and why these rows won.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import _env
from ._host import next_pow2, prev_pow2


@dataclass(frozen=True)
class Launch:
    block_h: int  # heads a program (a power of two)
    block_d: int
    num_warps: int
    stream: bool = False  # streaming cache hints: evict-first loads, .cs stores
    block_b: int = 1  # tokens a program (a power of two; > 1 only in the interpreter, see below)

    def grid(self, batch: int, heads: int) -> tuple[int, int]:
        return (-(-batch // self.block_b), -(-heads // self.block_h))


@dataclass(frozen=True)
class Rule:
    """For problems of at most ``max_rows`` rows (token x head pairs the kernel walks): BLOCK_D
    is the head dim's power of two capped at ``block_d_cap`` lanes, and a program's BLOCK_H
    heads (at least one, at most the heads there are) fill ``lanes`` lanes; with
    ``span_tokens`` BLOCK_B tokens a program fill what one token's heads leave. With
    ``per_rank``, ``lanes`` counts the loads of all N ranks (the combine reads N lanes for each
    lane it writes): a program gets ``lanes / N`` output lanes, so its bytes in flight do not
    grow with N. ``one_peer_warps``: the warps of a program whose heads all go to one peer
    (BLOCK_H <= H/N; the pack then writes one contiguous slab of the wire); with it, a full
    program whose heads would straddle two peers (BLOCK_H = 2 H/N) takes one peer's H/N heads
    instead, at ``num_warps``."""

    max_rows: float
    block_d_cap: int
    lanes: int
    num_warps: int
    stream: bool = False
    span_tokens: bool = False
    per_rank: bool = False
    one_peer_warps: int = 0

    def launch(self, batch: int, heads: int, head_lanes: int, ranks: int = 1) -> Launch:
        block_d = min(next_pow2(head_lanes), self.block_d_cap)
        lanes = self.lanes // ranks if self.per_rank else self.lanes
        rows = prev_pow2(max(1, lanes // block_d))
        block_h = _fit(rows, heads)
        block_b = _fit(rows // block_h, batch) if self.span_tokens else 1
        warps = self.num_warps
        slab = heads // ranks  # heads a peer gets
        if self.one_peer_warps and block_h <= slab:
            warps = self.one_peer_warps
        elif self.one_peer_warps and block_h == 2 * slab and block_h * block_d == lanes:
            block_h = slab  # a full program that straddled two peers: one peer's slab instead
        return Launch(block_h, block_d, warps, self.stream, block_b)


_ANY = float("inf")
# Lanes count 32-bit words on the paired path (16-bit dtypes, even D): D=512 bf16 is 256 lanes.
TABLE: dict[str, tuple[Rule, ...]] = {
    # (docs/perf.md, fourth pass: a sweep of heads a program x warps at every grid point)
    # up to 256 rows 256 lanes a program, 4 warps; up to 1024 rows 512 lanes, 4 warps (a
    # D=512 bf16 head is 256 lanes: one or two heads a program); up to 64k rows 512 lanes and
    # one warp (16 lanes a thread: many small programs, which the sweep found best from 2k to
    # 64k rows, where 4096-lane programs left the GPU part idle: up to 1.14x the
    # straightforward design's time); above, 4096 lanes a program (16 heads x 256 words),
    # 16 warps where those heads are one peer's slab (3 % faster at all 18 such points of the
    # grid, up to 38 % slower where a program's heads straddle two peers; those take one
    # peer's slab, 8 warps: B=8192 H=64 N=8 D=512 bf16 283.3 -> 277.5 us in the sweep)
    "pack": (Rule(256, 1024, 256, 4), Rule(1024, 1024, 512, 4), Rule(65536, 1024, 512, 1),
             Rule(_ANY, 1024, 4096, 8, one_peer_warps=16)),
    # one head per program while that keeps the GPU busy (8 warps at the smallest sizes, 4 up to
    # 16k rows: as many programs as the straightforward design, which otherwise won at B 32-128);
    # large batches: 8192 / N lanes a program (D=512 bf16: 4 heads at N=8, 8 at N=4, each in
    # one 256-word tile; 8 heads x 128 words whatever N was 77 % of copy at N=8)
    "combine": (Rule(256, 512, 1, 8), Rule(16384, 512, 1, 4),
                Rule(_ANY, 256, 8192, 8, per_rank=True)),
    # the AG+RS weighting kernel (a read and a write of the local output)
    "scale": (Rule(_ANY, 512, 4096, 4),),
}
# Triton's CPU interpreter runs a program at a time through numpy: big tiles, few programs
# (a combine program spans many tokens: 1024 rows of one head each are 2 programs, not 1024).
# The pack keeps one token a program there: its programs then run one after another, so a
# staging buffer that overlaps the output it packs corrupts bytes on the CPU as it does on a
# GPU (one program reading everything before writing anything would hide it).
INTERPRETER = {"pack": Rule(_ANY, 1024, 4096, 4),
               "combine": Rule(_ANY, 512, 4096, 4, span_tokens=True),
               "scale": Rule(_ANY, 512, 4096, 4, span_tokens=True)}

# Tables the benchmark can compare with TABLE in one run (``python -m dcp_a2a.testing.bench
# --grid --tables table,head_per_program``); docs/perf.md has the grid where these were chosen.
CANDIDATES: dict[str, dict[str, tuple[Rule, ...]]] = {
    "table": TABLE,
    "head_per_program": {  # one head per program up to 16k rows in both kernels, 4 warps
        "pack": (Rule(16384, 1024, 1, 4), Rule(_ANY, 1024, 4096, 8)),
        "combine": (Rule(16384, 512, 1, 4), Rule(_ANY, 128, 1024, 8)),
        "scale": TABLE["scale"],
    },
    # pack at decode sizes (docs/perf.md, 2026-12-01): 512 lanes a program, 2 warps (the table
    # until then); one head a program with 4 warps; 512 lanes with 4 warps; one head a program
    # also up to 16k rows
    "pack_512_lanes": {**TABLE, "pack": (Rule(1024, 1024, 512, 2), Rule(_ANY, 1024, 4096, 8))},
    "pack_head_4w": {**TABLE, "pack": (Rule(1024, 1024, 1, 4), Rule(_ANY, 1024, 4096, 8))},
    "pack_512_lanes_4w": {**TABLE, "pack": (Rule(1024, 1024, 512, 4),
                                            Rule(_ANY, 1024, 4096, 8))},
    "pack_mid_head": {**TABLE, "pack": (Rule(1024, 1024, 1, 2), Rule(16384, 1024, 1, 4),
                                        Rule(_ANY, 1024, 4096, 8))},
    # combine at large batches (docs/perf.md, third pass): 8 heads x 128 words whatever N (the
    # table until then); the head in one tile, 4 or 8 heads whatever N; 4096 / N lanes
    "combine_slab_128": {**TABLE, "combine": TABLE["combine"][:2] + (Rule(_ANY, 128, 1024, 8),)},
    "combine_one_tile": {**TABLE, "combine": TABLE["combine"][:2] + (Rule(_ANY, 256, 1024, 8),)},
    "combine_one_tile_8h": {**TABLE,
                            "combine": TABLE["combine"][:2] + (Rule(_ANY, 256, 2048, 8),)},
    "combine_per_rank_4k": {**TABLE, "combine": TABLE["combine"][:2] + (
        Rule(_ANY, 256, 4096, 8, per_rank=True),)},
    # pack at large batches: 8 warps (the table until then), 16 warps whatever the peers
    "pack_8w": {**TABLE, "pack": (Rule(1024, 1024, 1, 2), Rule(_ANY, 1024, 4096, 8))},
    "pack_16w": {**TABLE, "pack": (Rule(1024, 1024, 1, 2), Rule(_ANY, 1024, 4096, 16))},
    # the pack rules of the third pass (one head a program and 2 warps up to 1024 rows, 4096
    # lanes and 8 warps above)
    "pack_third_pass": {**TABLE, "pack": (Rule(1024, 1024, 1, 2), Rule(32768, 1024, 4096, 8),
                                          Rule(_ANY, 1024, 4096, 8, one_peer_warps=16))},
}

OVERRIDES: dict[str, Launch] = {}


ACTIVE = TABLE  # the table in use; the benchmark swaps in CANDIDATES to compare them


def _fit(block: int, n: int) -> int:
    return max(1, min(block, next_pow2(n)))


def _compiled(cfg: Launch) -> Launch:
    """One token a program when compiled. Several (BLOCK_B > 1) exist for the interpreter's
    sake; compiled, the pack with BLOCK_B = 2 stopped on a misaligned address on an H200
    (Triton 3.6 vectorised a store over the flattened token x head index), so no compiled
    launch uses them."""
    return cfg if _env.INTERPRET or cfg.block_b == 1 else replace(cfg, block_b=1)


def launch(kind: str, batch: int, heads: int, head_lanes: int, ranks: int = 1) -> Launch:
    """The launch for kernel ``kind`` over ``batch`` tokens of ``heads`` heads of
    ``head_lanes`` lanes, in a group of ``ranks`` (the rules select on the rows, batch x
    heads)."""
    if kind in OVERRIDES:
        o = OVERRIDES[kind]
        return _compiled(Launch(_fit(o.block_h, heads), min(o.block_d, next_pow2(head_lanes)),
                                o.num_warps, o.stream, _fit(o.block_b, batch)))
    if _env.INTERPRET:
        return INTERPRETER[kind].launch(batch, heads, head_lanes, ranks)
    rule = next(r for r in ACTIVE[kind] if batch * heads <= r.max_rows)
    return _compiled(rule.launch(batch, heads, head_lanes, ranks))


def every_launch(kind: str, batch: int, heads: int, head_lanes: int,
                 ranks: int = 1) -> list[Launch]:
    """Every launch any rule of the table (and the interpreter's) gives this problem,
    whatever rule its row count selects."""
    seen = []
    for rule in ACTIVE[kind] + (INTERPRETER[kind],):
        cfg = _compiled(rule.launch(batch, heads, head_lanes, ranks))
        if cfg not in seen:
            seen.append(cfg)
    return seen


def pack_launch(batch: int, heads: int, head_lanes: int, ranks: int) -> Launch:
    return launch("pack", batch, heads, head_lanes, ranks)


def combine_launch(ranks: int, batch: int, heads: int, head_lanes: int) -> Launch:
    return launch("combine", batch, heads, head_lanes, ranks)


def scale_launch(ranks: int, batch: int, heads: int, head_lanes: int) -> Launch:
    return launch("scale", batch, heads, head_lanes)
