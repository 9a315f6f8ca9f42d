"""Launch configurations of the kernels (block sizes, warps): a table, chosen per problem shape.

The table is fixed data, so a CUDA graph captured at one batch size replays the launch it
captured, and the tests can run every configuration the table can pick
(``every_launch``): the kernels' results are bitwise the same under each of them (no FMA
contraction, fixed summation order; see :mod:`dcp_a2a.kernels.merge_math`). The benchmark
(``python -m dcp_a2a.testing.bench --sweep``) overrides the table through ``OVERRIDES`` to time
variants in one run; docs/perf_history.md records what was tried and why these rows won.
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
    slab: bool = False  # pack only: the slab kernel, BLOCK_H heads (4 | BLOCK_H | H/N) a chunk
    lane_loads: bool = False  # pack's row kernel: loads in the stores' layout (no shared memory)
    head_major: bool = False  # the grid's first axis walks heads (see ``grid``; the table
    # gives it to pack launches only, the combine's is a bench candidate)
    # combine: programs a head, each one BLOCK_D tile of its lanes (split_d x block_d covers
    # the head; a grid's third axis): fewer registers a program, more programs
    split_d: int = 1

    def grid(self, batch: int, heads: int) -> tuple[int, ...]:
        """(token blocks, head blocks), or with ``head_major`` (head blocks, token blocks):
        programs are dispatched first axis first, so those running at once then read one
        token's heads (consecutive bytes), not one head of consecutive tokens (H x D apart).
        With ``split_d`` > 1, a third axis: the tile of the head."""
        tokens, head_blocks = -(-batch // self.block_b), -(-heads // self.block_h)
        grid = (head_blocks, tokens) if self.head_major else (tokens, head_blocks)
        return grid + (self.split_d,) if self.split_d > 1 else grid


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
    instead, at ``num_warps``.

    ``slab`` (pack only): the slab kernel (:mod:`dcp_a2a.kernels.pack`), for problems it fits
    (``slab_ok``): a program's heads fill ``lanes`` lanes, at least 4 and at most what divides
    a peer's H/N; ``slab_warps`` ((lanes, heads, warps), ...) gives the warps of the first entry
    whose lanes and heads the program reaches. A program of fewer than ``min_lanes`` lanes
    does not take the rule (the next rule of the table does).

    ``lane_loads`` (pack's row kernel): its loads are one lane a thread, in the layout of its
    wire stores, instead of 16-byte vectors that a shared-memory shuffle and a CTA barrier
    then hand to the stores' layout (a decode launch waits on that shuffle).
    ``head_major`` (pack): the grid's first axis walks heads (``Launch.grid``).

    A rule takes only problems of more than ``min_rows`` rows, and with ``min_head_lanes`` /
    ``max_head_lanes`` only heads of at least / at most that many lanes, with ``max_ranks``
    only groups of at most that many ranks (a combine thread's loads in flight are N x its
    lanes: fewer ranks, fewer bytes in flight a warp), with ``min_ranks`` only groups of at
    least that many."""

    max_rows: float
    block_d_cap: int
    lanes: int
    num_warps: int
    stream: bool = False
    span_tokens: bool = False
    per_rank: bool = False
    one_peer_warps: int = 0
    slab: bool = False
    slab_warps: tuple[tuple[int, int, int], ...] = ()
    min_lanes: int = 0
    lane_loads: bool = False
    min_head_lanes: int = 0
    max_head_lanes: int = 0
    head_major: bool = False
    min_rows: int = 0
    max_ranks: int = 0
    min_ranks: int = 0

    def launch(self, batch: int, heads: int, head_lanes: int, ranks: int = 1,
               slab_ok: bool = False, any_size: bool = False) -> Launch | None:
        """The launch, or None where this rule does not take the problem (a slab rule where
        the problem does not fit the slab kernel; unless ``any_size``, rows or head lanes out of
        the rule's bounds, a slab program below ``min_lanes``)."""
        if not any_size and ((self.min_rows and batch * heads <= self.min_rows)
                             or head_lanes < self.min_head_lanes
                             or (self.max_head_lanes and head_lanes > self.max_head_lanes)
                             or (self.max_ranks and ranks > self.max_ranks)
                             or ranks < self.min_ranks):
            return None
        block_d = min(next_pow2(head_lanes), self.block_d_cap)
        lanes = self.lanes // ranks if self.per_rank else self.lanes
        rows = prev_pow2(max(1, lanes // block_d))
        if self.slab:
            if not slab_ok:
                return None
            g = slab_heads(rows, heads, ranks)
            if g * head_lanes < self.min_lanes and not any_size:
                return None
            warps = next(w for lanes_, heads_, w in self.slab_warps
                         if g * head_lanes >= lanes_ and g >= heads_)
            return Launch(g, block_d, warps, self.stream, slab=True, head_major=self.head_major)
        block_h = _fit(rows, heads)
        block_b = _fit(rows // block_h, batch) if self.span_tokens else 1
        warps = self.num_warps
        slab = heads // ranks  # heads a peer gets
        if self.one_peer_warps and block_h <= slab:
            warps = self.one_peer_warps
        elif self.one_peer_warps and block_h == 2 * slab and block_h * block_d == lanes:
            block_h = slab  # a full program that straddled two peers: one peer's slab instead
        return Launch(block_h, block_d, warps, self.stream, block_b,
                      lane_loads=self.lane_loads, head_major=self.head_major)


_ANY = float("inf")

# The combine rules as the seventeenth pass left them (docs/perf_history.md; the comment on
# TABLE's combine rules gives what each of its rows was chosen from).
_COMBINE_SEVENTEENTH = (
    Rule(128, 512, 1, 8),
    Rule(512, 512, 1, 1, min_rows=256, min_head_lanes=256, max_head_lanes=256),
    Rule(2048, 512, 64, 2, min_rows=256, min_head_lanes=32, max_head_lanes=32),
    Rule(2048, 512, 128, 2, min_rows=256, min_head_lanes=64, max_head_lanes=64),
    Rule(2048, 512, 256, 4, min_rows=256, min_head_lanes=128, max_head_lanes=128),
    Rule(256, 512, 1, 4, min_head_lanes=256),
    Rule(256, 512, 1, 8),
    Rule(512, 512, 1, 1, max_head_lanes=64), Rule(512, 512, 1, 2, max_head_lanes=128),
    Rule(512, 512, 1, 4),
    Rule(1024, 512, 1, 2, min_head_lanes=256, max_head_lanes=256, max_ranks=4),
    Rule(1024, 512, 1, 1), Rule(4096, 512, 1, 2),
    Rule(16384, 512, 1, 4), Rule(_ANY, 256, 8192, 8, per_rank=True),
)
# The nineteenth pass: the eighteenth's rules with two edited and two added (TABLE's comment
# says what each rule was chosen from).
_COMBINE_NINETEENTH = (  # the first rule that takes a problem gives its launch
    Rule(128, 512, 1, 4, max_head_lanes=128),
    Rule(128, 512, 1, 4, min_head_lanes=256, max_head_lanes=256, max_ranks=4),
    Rule(128, 512, 1, 8),
    Rule(512, 512, 1, 4, min_head_lanes=512, max_head_lanes=512, max_ranks=4),
    Rule(512, 512, 1, 2, min_head_lanes=512, max_head_lanes=512),
    Rule(512, 512, 1, 4, min_rows=256, min_head_lanes=256, max_head_lanes=256, max_ranks=4),
    Rule(512, 512, 1, 1, min_rows=256, min_head_lanes=256, max_head_lanes=256),
    Rule(2048, 512, 64, 2, min_rows=256, min_head_lanes=32, max_head_lanes=32),
    Rule(2048, 512, 128, 2, min_rows=256, min_head_lanes=64, max_head_lanes=64),
    Rule(2048, 512, 256, 4, min_rows=256, min_head_lanes=128, max_head_lanes=128),
    Rule(256, 512, 128, 4, max_head_lanes=64),
    Rule(256, 512, 1, 2, min_head_lanes=128, max_head_lanes=128),
    Rule(256, 512, 1, 4, min_head_lanes=256),
    Rule(256, 512, 1, 8),
    Rule(512, 512, 1, 1, max_head_lanes=64), Rule(512, 512, 1, 2, max_head_lanes=128),
    Rule(512, 512, 1, 4),
    Rule(1024, 512, 1, 4, min_head_lanes=512, max_head_lanes=512, max_ranks=4),
    Rule(1024, 512, 1, 2, min_head_lanes=512, max_head_lanes=512),
    Rule(1024, 512, 1, 2, min_head_lanes=256, max_head_lanes=256, max_ranks=4),
    Rule(1024, 512, 1, 1),
    Rule(4096, 512, 1, 2, min_rows=2048, min_head_lanes=33, max_head_lanes=63, min_ranks=8),
    Rule(16384, 512, 128, 2, min_rows=2048, max_head_lanes=32),
    Rule(16384, 512, 256, 2, min_rows=2048, min_head_lanes=33, max_head_lanes=64),
    Rule(16384, 512, 512, 1, min_rows=4096, min_head_lanes=256, max_head_lanes=256,
         max_ranks=2),
    Rule(4096, 512, 512, 4, min_rows=2048, min_head_lanes=128, max_head_lanes=128,
         max_ranks=2),
    Rule(4096, 512, 1, 2),
    Rule(16384, 512, 1, 4), Rule(_ANY, 256, 8192, 8, per_rank=True),
)
# The eighteenth pass's rules (the bench candidate ``combine_eighteenth_pass``): the
# nineteenth's without what it added or changed.
_NINETEENTH_ADDED = (
    Rule(1024, 512, 1, 2, min_head_lanes=512, max_head_lanes=512),
    Rule(4096, 512, 512, 4, min_rows=2048, min_head_lanes=128, max_head_lanes=128,
         max_ranks=2),
)
_EIGHTEENTH_WAS = {  # a nineteenth-pass rule: the eighteenth's in its place
    Rule(512, 512, 1, 4, min_rows=256, min_head_lanes=256, max_head_lanes=256, max_ranks=4):
        Rule(512, 512, 1, 4, min_rows=256, min_head_lanes=256, max_head_lanes=256, max_ranks=2),
    Rule(1024, 512, 1, 4, min_head_lanes=512, max_head_lanes=512, max_ranks=4):
        Rule(1024, 512, 1, 4, min_head_lanes=512, max_head_lanes=512, max_ranks=2),
}
_COMBINE_EIGHTEENTH = tuple(_EIGHTEENTH_WAS.get(r, r) for r in _COMBINE_NINETEENTH
                            if r not in _NINETEENTH_ADDED)
# Lanes count 32-bit words on the paired path (16-bit dtypes, even D): D=512 bf16 is 256 lanes.
TABLE: dict[str, tuple[Rule, ...]] = {
    # (docs/perf_history.md, fourth pass: a sweep of heads a program x warps at every grid point)
    # up to 256 rows 256 lanes a program, 4 warps; up to 1024 rows 512 lanes, 4 warps (a
    # D=512 bf16 head is 256 lanes: one or two heads a program); up to 64k rows 512 lanes and
    # one warp (16 lanes a thread: many small programs, which the sweep found best from 2k to
    # 64k rows, where 4096-lane programs left the GPU part idle: up to 1.14x the
    # straightforward design's time); above, 4096 lanes a program (16 heads x 256 words),
    # 16 warps where those heads are one peer's slab (3 % faster at all 18 such points of the
    # grid, up to 38 % slower where a program's heads straddle two peers; those take one
    # peer's slab, 8 warps: B=8192 H=64 N=8 D=512 bf16 283.3 -> 277.5 us in the sweep)
    # (fifth pass: above 64k rows the slab kernel, 16-byte stores of whole chunks of a peer's
    # heads, where the problem fits it: 4096 lanes a program, fewer where a peer has fewer
    # heads; warps by the program's lanes, from a sweep of every such grid point. Programs of
    # 256 lanes lost to the row kernel (D=64 bf16, 8 heads: 44.9 against 43.2 us), 320 won
    # (D=80, 8 heads: 46.9 against 65.3 us); the row rule after it takes the rest)
    # (sixth pass: up to 1024 rows the loads in the stores' layout, 2-3 % faster, except heads
    # of 512 lanes (fp32 D=512) from 256 rows, where the vector loads were 3 % faster; above
    # 64k rows a 16-head slab program (4096 lanes of 16-bit D=512) takes 16 warps: 4 had
    # become 285 us at B=8192 H=64 N=4 bf16, 16 took 270 us; 4096 lanes of fp32 keep 4)
    # (seventh pass: heads of 512 lanes (fp32 D=512) from 4k to 8k rows in the slab kernel, 4
    # heads and 2 warps a program (0.90-0.92 of the straightforward kernel's time against
    # 0.95-0.97); above 8k rows the row kernel, a head and a warp a program, on a head-major
    # grid: programs running at once read one token's heads, consecutive bytes (0.93-0.99
    # against 0.94-1.00 from 16k to 131k rows; at B=8192 4 % faster than the slab kernel);
    # head-major was no faster for heads of other sizes)
    # (eighth pass: 512-lane heads up to 1024 rows two heads a program, 4 warps, loads in the
    # stores' layout: a median 0.89 of the straightforward kernel's time, worst 0.92, against
    # 0.92 and 0.96 for one head a program, from a sweep of 32 launches at those 17 points)
    # (ninth pass: 512-lane heads from 1k to 2k rows two heads and two warps a program, vector
    # loads: 0.87-0.91 of the straightforward kernel's time against 0.91-0.94 for one head and
    # a warp, the best of 22 launches at all 5 such points in two sweeps a session apart)
    # (tenth pass: 256-lane heads (16-bit D=512) up to 256 rows four heads a program, 4 warps,
    # lane loads: B=1 H=128 N=8 bf16 1.29 against 1.40 us for one head a program, the best of
    # 36 launches there; over the 20 such grid points a median 0.975 of one head's time,
    # 0.93-0.97 from 128 rows, 0.98-1.02 at 64 rows or fewer)
    # (eleventh pass, sweeps of 46 launches: 128-lane heads (fp32 D=128, 16-bit D=256) from 64
    # to 1024 rows four heads and 2 warps a program, lane loads, where two or four heads at 4
    # warps had been: in a second run a median 0.962 of their time at the 12 fp32 grid points
    # (0.914-0.989), 0.964 at 12 bf16 D=256 points (0.916-0.999); at 64 rows or fewer a tie.
    # 512-lane heads from 2k to 4k rows two heads and one warp a program, lane loads: 0.966-0.985
    # of one head and a warp with vector loads at all 5 such points; 0.973-1.011 (median 0.982)
    # in the second run)
    "pack": (Rule(1024, 1024, 1024, 4, lane_loads=True, min_head_lanes=512, max_head_lanes=512),
             Rule(256, 1024, 1024, 4, lane_loads=True, min_head_lanes=256, max_head_lanes=256),
             Rule(1024, 1024, 512, 2, lane_loads=True, min_rows=64, min_head_lanes=128,
                  max_head_lanes=128),
             Rule(256, 1024, 256, 4, lane_loads=True),
             Rule(1024, 1024, 512, 4, lane_loads=True, max_head_lanes=256),
             Rule(1024, 1024, 512, 4),
             Rule(2048, 1024, 1024, 2, min_head_lanes=512, max_head_lanes=512),
             Rule(4096, 1024, 1024, 1, lane_loads=True, min_rows=2048, min_head_lanes=512,
                  max_head_lanes=512),
             Rule(8192, 1024, 2048, 2, slab=True, slab_warps=((0, 0, 2),), min_rows=4096,
                  min_head_lanes=512, max_head_lanes=512),
             Rule(_ANY, 1024, 512, 1, head_major=True, min_rows=8192, min_head_lanes=512,
                  max_head_lanes=512),
             Rule(65536, 1024, 512, 1),
             Rule(_ANY, 1024, 4096, 4, slab=True, min_lanes=320,
                  slab_warps=((4096, 16, 16), (4096, 0, 4), (2048, 0, 8), (1024, 0, 4),
                              (0, 0, 1))),
             Rule(_ANY, 1024, 4096, 8, one_peer_warps=16)),
    # one head per program while that keeps the GPU busy (as many programs as the
    # straightforward design, which otherwise won at B 32-128); large batches: 8192 / N lanes a
    # program (D=512 bf16: 4 heads at N=8, 8 at N=4, each in one 256-word tile; 8 heads x 128
    # words whatever N was 77 % of copy at N=8). The warps a head (fifteenth pass, issue 47:
    # the engine's decode batches, three probes on an H200 and two H100s with one answer):
    # 8 up to 128 rows; 4 for 256-lane heads up to 256 rows (B=16 H=128 N=8: 0.90-0.92 of the
    # engine design's time, 0.93-0.96 at 8); up to 512 rows about two lanes a thread (1 warp to
    # 64 lanes, 2 to 128, else 4); 1 warp up to 1k rows (0.83-0.98 of the engine design, where
    # 4 warps took 0.99-1.05); 2 warps up to 4k rows (0.78-0.91); 4 up to 16k rows.
    # (sixteenth pass, issue 47: two probes on an H100 a session apart, 06c8cc4 and ed1da07,
    # docs/perf.md) Heads of at most 128 lanes from 512 to 2048 rows two heads a program, 2
    # warps (32 and 64 lanes) or 4 (128 lanes): 0.63-0.91 of the engine design's time at the
    # 8 such rows of the table against 0.78-0.96 for one head a program, the same in
    # both probes within 0.01; heads of 256 lanes two a program only at 1024 rows of N = 4
    # (0.944 twice, against 0.952 / 0.985), elsewhere no better or worse. With the native
    # bf16 rounding (combine.NATIVE_BF16_MAX_WARPS), 256-lane heads from 256 to 512 rows one
    # warp a head: B=32 H=128 N=8 0.910 / 0.911 of the engine design in both probes, where 4
    # warps took 1.014 / 1.016 rounding natively and 0.967 / 0.966 by integers.
    # (seventeenth pass) 256-lane heads from 512 to 1024 rows in groups of at most 4 ranks:
    # one head and 2 warps a program (B=64 H=64 N=4: 0.938 / 0.944 of the engine design in the
    # two probes, against 0.952 / 0.959 at one warp; as the table's launch at 9459b05, 0.936
    # where one warp took 0.968. At N = 8, twice the loads in flight a thread, one warp kept:
    # 0.865 against 0.936 at 2 warps).
    # (eighteenth pass, issue 47: the grid's points slower than the engine design, timed with
    # candidate launches on an H100, docs/perf_data/issue47_grid_misses_84ce0f5_h100.json)
    # Up to 128 rows 4 warps for heads of at most 128 lanes (0.93-0.99 of the engine design at
    # 32-128 lanes and N = 2-8, where 8 warps took 1.00-1.09) and for 256-lane heads in groups
    # of at most 4 (0.90-0.92 against 0.97-0.99); 8 for the rest (B=1 H=128 N=8: 0.86 against
    # 0.89). From 129 to 256 rows 128 lanes a program at 4 warps for heads of at most 64 lanes
    # (four 32-lane heads: 0.89-0.97, two 64-lane: 0.91-1.00, against 1.04-1.14 at one head
    # and 8 warps), 2 warps for 128-lane heads (0.89-1.02 against 1.03-1.05); fp32 D=512 (512
    # lanes) 2 warps from 129 to 512 rows in groups of 8 (0.91-0.98 against 1.04-1.14). Groups
    # of 2: 4 warps for 256-lane heads from 257 to 512 rows (0.98 / 1.05 fp16 / bf16 against
    # 1.08) and 512-lane heads from 513 to 1024 (1.03 against 1.11). From 2k to 16k rows four
    # heads of at most 64 lanes and 2 warps a program (0.24-0.57 of the engine design's time at
    # 8k-16k rows, where one head a program took 0.99-1.03: those launches left the GPU mostly
    # idle, at 17-30 % of copy), and two 256-lane heads and one warp in groups of 2 (0.80
    # against 1.11 at 8k rows). At 163 grid points whose launch this changed (the same probe
    # --changed-from, a63fcd4): 161 faster or within 1 %, none missed that had been met; the
    # two slower, 40-lane heads (D=80) at 4096 rows in groups of 8 (0.61-0.63 of the engine
    # design against 0.55), keep one head and 2 warps there.
    # (nineteenth pass: the eighteenth pass's grid on an H100 and every candidate launch at its
    # 42 points above 1.0, docs/perf_data/issue47_grid_misses_eighteenth_h100.json) 256-lane
    # heads from 257 to 512 rows 4 warps in groups of 4 too (0.94-0.96 of the engine design
    # against 1.00-1.03 at one warp); 512-lane heads (fp32 D=512) from 513 to 1024 rows 4 warps
    # in groups of up to 4 (0.996-1.000 against 1.056-1.057 at one warp) and 2 in groups of 8
    # (0.980-0.995 against 1.017-1.042); 128-lane heads in groups of 2 from 2k to 4k rows, four
    # heads and 4 warps a program (fp32 D=128 at 4096 rows: 0.637 against 1.010).
    "combine": _COMBINE_NINETEENTH,
    # the AG+RS weighting kernel (a read and a write of the local output)
    "scale": (Rule(_ANY, 512, 4096, 4),),
}
# Triton's CPU interpreter runs a program at a time through numpy: big tiles, few programs
# (a program spans many tokens: 1024 rows of one head each are 2 programs, not 1024; the pack's
# one token a program made a 1500-token exchange 12 s, now 0.2 s). The programs still run one
# after another, so a staging buffer overlapping the output it packs corrupts bytes on the CPU
# once the launch has several programs, as it does on a GPU once it has several waves
# (test_wire_format's many_waves case: 8192 tokens).
INTERPRETER = {"pack": Rule(_ANY, 1024, 4096, 4, span_tokens=True),
               "combine": Rule(_ANY, 512, 4096, 4, span_tokens=True),
               "scale": Rule(_ANY, 512, 4096, 4, span_tokens=True)}

# The pack rules as the tenth pass left them (docs/perf_history.md): two or four heads and 4
# warps a program for heads of 128 lanes up to 1024 rows; one head and one warp, vector loads,
# for heads of 512 lanes from 2k to 4k rows.
_PACK_TENTH = TABLE["pack"][:2] + TABLE["pack"][3:7] + TABLE["pack"][8:]
# ... and as the ninth pass did: one head a program for heads of 256 lanes up to 256 rows.
_PACK_NINTH = _PACK_TENTH[:1] + _PACK_TENTH[2:]
# ... and as the eighth pass did: one head and one warp a program for heads of 512 lanes from
# 1k to 2k rows.
_PACK_EIGHTH = _PACK_NINTH[:4] + _PACK_NINTH[5:]
# ... and as the seventh pass did: one head a program for heads of 512 lanes up to 1024 rows.
_PACK_SEVENTH = _PACK_EIGHTH[1:]
# ... and as the sixth pass did: no rule of their own for heads of 512 lanes above 1024 rows.
_PACK_SIXTH = _PACK_SEVENTH[:3] + _PACK_SEVENTH[5:]
# ... and as the fifth pass left them: vector loads at every size, 4 warps for every slab
# program of 4096 lanes.
_PACK_FIFTH = (Rule(256, 1024, 256, 4), Rule(1024, 1024, 512, 4), Rule(65536, 1024, 512, 1),
               replace(_PACK_SIXTH[4], slab_warps=((4096, 0, 4), (2048, 0, 8), (1024, 0, 4),
                                                   (0, 0, 1))),
               _PACK_SIXTH[5])

# Tables the benchmark can compare with TABLE in one run (``python -m dcp_a2a.testing.bench
# --grid --tables table,head_per_program``); docs/perf_history.md has the grid where these were
# chosen.
CANDIDATES: dict[str, dict[str, tuple[Rule, ...]]] = {
    "table": TABLE,
    "head_per_program": {  # one head per program up to 16k rows in both kernels, 4 warps
        "pack": (Rule(16384, 1024, 1, 4), Rule(_ANY, 1024, 4096, 8)),
        "combine": (Rule(16384, 512, 1, 4), Rule(_ANY, 128, 1024, 8)),
        "scale": TABLE["scale"],
    },
    # pack at decode sizes (docs/perf_history.md, 2026-12-01): 512 lanes a program, 2 warps (the
    # table until then); one head a program with 4 warps; 512 lanes with 4 warps; one head a
    # program also up to 16k rows
    "pack_512_lanes": {**TABLE, "pack": (Rule(1024, 1024, 512, 2), Rule(_ANY, 1024, 4096, 8))},
    "pack_head_4w": {**TABLE, "pack": (Rule(1024, 1024, 1, 4), Rule(_ANY, 1024, 4096, 8))},
    "pack_512_lanes_4w": {**TABLE, "pack": (Rule(1024, 1024, 512, 4),
                                            Rule(_ANY, 1024, 4096, 8))},
    "pack_mid_head": {**TABLE, "pack": (Rule(1024, 1024, 1, 2), Rule(16384, 1024, 1, 4),
                                        Rule(_ANY, 1024, 4096, 8))},
    # combine at large batches (docs/perf_history.md, third pass): 8 heads x 128 words whatever N
    # (the table until then); the head in one tile, 4 or 8 heads whatever N; 4096 / N lanes
    "combine_slab_128": {**TABLE, "combine": TABLE["combine"][:-1] + (Rule(_ANY, 128, 1024, 8),)},
    "combine_one_tile": {**TABLE, "combine": TABLE["combine"][:-1] + (Rule(_ANY, 256, 1024, 8),)},
    "combine_one_tile_8h": {**TABLE,
                            "combine": TABLE["combine"][:-1] + (Rule(_ANY, 256, 2048, 8),)},
    "combine_per_rank_4k": {**TABLE, "combine": TABLE["combine"][:-1] + (
        Rule(_ANY, 256, 4096, 8, per_rank=True),)},
    # pack at large batches: 8 warps (the table until then), 16 warps whatever the peers
    "pack_8w": {**TABLE, "pack": (Rule(1024, 1024, 1, 2), Rule(_ANY, 1024, 4096, 8))},
    "pack_16w": {**TABLE, "pack": (Rule(1024, 1024, 1, 2), Rule(_ANY, 1024, 4096, 16))},
    # the pack rules of the fourth pass (the row kernel at every size)
    "pack_fourth_pass": {**TABLE, "pack": _PACK_FIFTH[:3] + _PACK_FIFTH[4:]},
    # the pack rules of the fifth pass (vector loads at every size)
    "pack_fifth_pass": {**TABLE, "pack": _PACK_FIFTH},
    # sixth pass (docs/perf_history.md): lane loads also up to 64k rows; the slab kernel (one warp,
    # 512 lanes) from 8k to 64k rows where it fits; lane loads for every head up to 1024 rows
    "pack_lane_mid": {**TABLE, "pack": _PACK_SIXTH[:3] + (
        Rule(65536, 1024, 512, 1, lane_loads=True),) + _PACK_SIXTH[4:]},
    "pack_slab_mid": {**TABLE, "pack": _PACK_SIXTH[:3] + (
        Rule(8192, 1024, 512, 1), Rule(65536, 1024, 512, 1, slab=True, slab_warps=((0, 0, 1),)))
        + _PACK_SIXTH[3:]},
    "pack_lane_all": {**TABLE, "pack": (_PACK_SIXTH[0], replace(_PACK_SIXTH[1],
                                                                max_head_lanes=0))
                      + _PACK_SIXTH[3:]},
    # the pack rules of the sixth and seventh passes
    "pack_sixth_pass": {**TABLE, "pack": _PACK_SIXTH},
    "pack_seventh_pass": {**TABLE, "pack": _PACK_SEVENTH},
    "pack_eighth_pass": {**TABLE, "pack": _PACK_EIGHTH},
    "pack_ninth_pass": {**TABLE, "pack": _PACK_NINTH},
    "pack_tenth_pass": {**TABLE, "pack": _PACK_TENTH},
    # the combine rules of the seventeenth pass (8 warps for small heads up to 256 rows, one
    # head a program up to 16k rows)
    "combine_seventeenth_pass": {**TABLE, "combine": _COMBINE_SEVENTEENTH},
    "combine_eighteenth_pass": {**TABLE, "combine": _COMBINE_EIGHTEENTH},
    # ... and with four 40-lane heads a program at 2k-4k rows in groups of 8 too (a63fcd4)
    "combine_a63fcd4": {**TABLE, "combine": tuple(r for r in _COMBINE_EIGHTEENTH
                                                   if not r.min_ranks)},
    # the combine's rules with a head-major grid where a problem has more than 1024 rows (the
    # twenty-sixth pass: 1.5-4 % faster than token-major at 4096-8192 rows of 256-lane heads,
    # none at 1024; docs/perf_history.md): every rule of more than 1024 rows on that grid, to
    # time at the grid's points before any rule of the table takes it
    "combine_head_major": {**TABLE, "combine": tuple(
        replace(r, head_major=True) if r.max_rows > 1024 else r for r in TABLE["combine"])},
    # the pack rules of the third pass (one head a program and 2 warps up to 1024 rows, 4096
    # lanes and 8 warps above)
    "pack_third_pass": {**TABLE, "pack": (Rule(1024, 1024, 1, 2), Rule(32768, 1024, 4096, 8),
                                          Rule(_ANY, 1024, 4096, 8, one_peer_warps=16))},
}

OVERRIDES: dict[str, Launch] = {}


ACTIVE = TABLE  # the table in use; the benchmark swaps in CANDIDATES to compare them


def _fit(block: int, n: int) -> int:
    return max(1, min(block, next_pow2(n)))


def slab_heads(block: int, heads: int, ranks: int) -> int:
    """Heads of a slab-kernel program asked for ``block``: a power of two, at least 4 and at
    most the largest power of two dividing a peer's H/N (a multiple of 4 where the slab kernel
    fits), so that a program's heads are one peer's and its chunk starts on 16 bytes."""
    per_peer = heads // ranks
    return max(4, min(prev_pow2(max(1, block)), per_peer & -per_peer))


# CUDA's limit on a grid's second axis: a head-major grid has its token blocks there.
_MAX_GRID_Y = 65535


def _compiled(cfg: Launch, batch: int = 1) -> Launch:
    """One token a program when compiled. Several (BLOCK_B > 1) exist for the interpreter's
    sake; compiled, the pack with BLOCK_B = 2 stopped on a misaligned address on an H200
    (Triton 3.6 vectorised a store over the flattened token x head index), so no compiled
    launch uses them. A head-major launch of more token blocks than a grid's second axis
    holds becomes token-major (the same bytes, programs in another order)."""
    if not _env.INTERPRET and cfg.block_b != 1:
        cfg = replace(cfg, block_b=1)
    if cfg.head_major and -(-batch // cfg.block_b) > _MAX_GRID_Y:
        cfg = replace(cfg, head_major=False)
    return cfg


# The launch each problem got, so that an eager call looks it up instead of walking the rules
# (their Launch objects and row arithmetic were microseconds of Python a call; issue 47). An
# entry keeps the rules it was chosen from and counts only while they are still the ones in
# force: the benchmark swaps ACTIVE, tests flip the interpreter; overrides are never cached.
# The returned Launch is the same object on every hit, which lets the launchers key their own
# per-launch caches on it.
_CHOSEN: dict[tuple, tuple] = {}
_CHOSEN_MAX = 4096  # distinct problems (batch sizes) kept; then it starts again


def launch(kind: str, batch: int, heads: int, head_lanes: int, ranks: int = 1,
           slab_ok: bool = False) -> Launch:
    """The launch for kernel ``kind`` over ``batch`` tokens of ``heads`` heads of
    ``head_lanes`` lanes, in a group of ``ranks`` (the rules select on the rows, batch x
    heads; ``slab_ok``: the pack's slab kernel fits the problem). An override asking for the
    slab kernel gets it where it fits, the row kernel elsewhere; one asking for ``split_d``
    gets the head's lanes in that many tiles a program (the combine)."""
    if OVERRIDES and kind in OVERRIDES:
        o = OVERRIDES[kind]
        block_d, split_d = min(o.block_d, next_pow2(head_lanes)), 1
        if o.split_d > 1:
            if kind != "combine":
                raise ValueError(f"split_d asks for a head over several programs: only the "
                                 f"combine takes it, not the {kind} kernel")
            # tiles of the head's power of two over split_d (block_d unused), as many as cover it
            block_d = max(1, next_pow2(head_lanes) // o.split_d)
            split_d = -(-head_lanes // block_d)
        if o.slab and slab_ok:
            return _compiled(Launch(slab_heads(o.block_h, heads, ranks), block_d, o.num_warps,
                                    o.stream, slab=True, head_major=o.head_major), batch)
        return _compiled(Launch(_fit(o.block_h, heads), block_d, o.num_warps, o.stream,
                                _fit(o.block_b, batch), lane_loads=o.lane_loads,
                                head_major=o.head_major, split_d=split_d), batch)
    rules = INTERPRETER[kind] if _env.INTERPRET else ACTIVE[kind]
    key = (kind, batch, heads, head_lanes, ranks, slab_ok)
    hit = _CHOSEN.get(key)
    if hit is not None and hit[0] is rules:
        return hit[1]
    if _env.INTERPRET:
        cfg = rules.launch(batch, heads, head_lanes, ranks)
    else:
        # the first rule that takes the problem (each table ends in a rule that takes any)
        taken = (r.launch(batch, heads, head_lanes, ranks, slab_ok) for r in rules
                 if batch * heads <= r.max_rows)
        cfg = _compiled(next(c for c in taken if c is not None), batch)
    if len(_CHOSEN) >= _CHOSEN_MAX:
        _CHOSEN.clear()
    _CHOSEN[key] = (rules, cfg)
    return cfg


def every_launch(kind: str, batch: int, heads: int, head_lanes: int,
                 ranks: int = 1, slab_ok: bool = False) -> list[Launch]:
    """Every launch any rule of the table (and the interpreter's) gives this problem,
    whatever rule its row count selects (a slab rule whatever the program's size)."""
    seen = []
    for rule in ACTIVE[kind] + (INTERPRETER[kind],):
        cfg = rule.launch(batch, heads, head_lanes, ranks, slab_ok, any_size=True)
        if cfg is not None and _compiled(cfg, batch) not in seen:
            seen.append(_compiled(cfg, batch))
    return seen


def pack_launch(batch: int, heads: int, head_lanes: int, ranks: int,
                slab_ok: bool = False) -> Launch:
    return launch("pack", batch, heads, head_lanes, ranks, slab_ok)


def combine_launch(ranks: int, batch: int, heads: int, head_lanes: int) -> Launch:
    return launch("combine", batch, heads, head_lanes, ranks)


def scale_launch(ranks: int, batch: int, heads: int, head_lanes: int) -> Launch:
    return launch("scale", batch, heads, head_lanes)
