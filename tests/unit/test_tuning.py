"""The launch tables: the H200's rules, the tables' files (read, checked, chosen per card) and
the rules a sweep writes (host arithmetic only: no kernel runs here)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import astuple, replace

import pytest

from dcp_a2a.kernels import tuning
from dcp_a2a.kernels._host import next_pow2

pytestmark = pytest.mark.unit


@pytest.fixture
def compiled(monkeypatch):
    """The compiled launches of the H200's table, the rules these tests state, whatever
    card's table this process took."""
    monkeypatch.setattr(tuning._env, "INTERPRET", False)
    monkeypatch.setattr(tuning, "ACTIVE", tuning.H200.rules)


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setattr(tuning._env, "INTERPRET", True)


SHAPES = [(b, h, lanes, n) for b in (1, 16, 1024, 8192) for h, n in ((128, 8), (64, 4), (16, 2))
          for lanes in (4, 40, 256)]


def test_compiled_launches_keep_one_token_a_program(compiled, monkeypatch):
    """Every compiled launch (table, every_launch, an override asking for more) has
    BLOCK_B = 1: the multi-token programs are the interpreter's only."""
    monkeypatch.setitem(tuning.OVERRIDES, "scale", tuning.Launch(4, 64, 4, block_b=8))
    for b, h, lanes, n in SHAPES:
        for kind, heads, ranks in (("pack", h, n), ("combine", h // n, n), ("scale", h, 1)):
            cfgs = [tuning.launch(kind, b, heads, lanes, ranks)]
            cfgs += tuning.every_launch(kind, b, heads, lanes, ranks)
            assert all(c.block_b == 1 for c in cfgs), (kind, b, heads, lanes, cfgs)


def test_interpreter_programs_span_tokens(interpreted):
    """1024 tokens of one head: a few combine and pack programs (a pack program a token made a
    1500-token exchange 12 s on the CPU). The 8192 tokens of test_wire_format's many_waves case
    are still many pack programs, run one after another, so a staging buffer overlapping the
    output it packs corrupts bytes on the CPU as it does on a GPU."""
    comb = tuning.launch("combine", 1024, 1, 4, 2)
    assert comb.block_b * comb.block_h >= 512 and comb.grid(1024, 1)[0] <= 2
    pack = tuning.launch("pack", 1024, 2, 4, 2)
    assert pack.block_b > 1 and math.prod(pack.grid(1024, 2)) <= 8
    many = tuning.launch("pack", 8192, 4, 4, 2)
    assert math.prod(many.grid(8192, 4)) >= 16


@pytest.mark.parametrize("n", [2, 4, 8])
def test_large_combine_lanes_shrink_with_the_group(compiled, n):
    """Above 16k rows a combine program takes 8192 / N output lanes (N x lanes loads in
    flight), the head in one tile: D=512 bf16 (256 words) gives 8 / 4 heads at N = 4 / 8."""
    cfg = tuning.launch("combine", 8192, 64 // n, 256, n)
    assert cfg.block_d == 256 and cfg.block_h * cfg.block_d == min(8192 // n, 256 * (64 // n))


@pytest.mark.parametrize("h, n, heads, warps", [(64, 4, 16, 16), (128, 8, 16, 16), (64, 8, 8, 8),
                                                (32, 4, 8, 8)])
def test_large_pack_programs_follow_the_peer_slab(compiled, h, n, heads, warps):
    """From 64k rows a pack program of 16 heads x 256 words runs 16 warps when the 16 heads
    are one peer's (H/N >= 16); where they would straddle two peers (H/N = 8) it takes one
    peer's 8 heads, 8 warps."""
    cfg = tuning.launch("pack", 8192, h, 256, n)
    assert (cfg.block_h, cfg.block_d, cfg.num_warps) == (heads, 256, warps)
    # a program that is not full (64-lane heads: 64 of them) keeps its heads across peers
    small = tuning.launch("pack", 8192, h, 64, n)
    assert small.block_h == min(h, 64) and small.num_warps == (16 if small.block_h <= h // n
                                                               else 8)
    # 4k-64k rows: 512 lanes (two such heads) and one warp a program
    assert astuple(tuning.launch("pack", 256, h, 256, n))[:3] == (2, 256, 1)


@pytest.mark.parametrize("h, n, words, heads, warps", [
    (64, 4, 256, 16, 16),  # D=512 16-bit: 16 heads = 4096 lanes, 16 warps
    (128, 8, 256, 16, 16),
    (64, 8, 256, 8, 8),    # 8 heads a peer: 2048 lanes, 8 warps
    (64, 4, 64, 16, 4),    # D=128 16-bit: all 16 of a peer's heads, 1024 lanes
    (32, 4, 40, 8, 1),     # D=80 16-bit: 8 heads = 320 lanes, one warp
])
def test_large_pack_takes_the_slab_kernel_where_it_fits(compiled, h, n, words, heads, warps):
    """Above 64k rows the pack writes chunks of one peer's heads with 16-byte stores, where the
    problem fits that kernel; elsewhere, and below 64k rows, the row kernel as before."""
    cfg = tuning.launch("pack", 8192, h, words, n, slab_ok=True)
    assert cfg.slab and (cfg.block_h, cfg.num_warps) == (heads, warps)
    assert (h // n) % cfg.block_h == 0
    assert not tuning.launch("pack", 8192, h, words, n).slab
    assert not tuning.launch("pack", 512, h, words, n, slab_ok=True).slab


@pytest.mark.parametrize("b, h, n", [(16, 128, 8), (32, 64, 4), (128, 16, 2), (32, 128, 8),
                                     (64, 128, 8), (128, 64, 4), (256, 64, 8), (1024, 128, 8),
                                     (8192, 16, 2)])
def test_heads_of_512_lanes_take_their_own_rules(compiled, b, h, n):
    """fp32 D=512 (512-lane heads) from 1k to 2k rows: the row kernel, two heads and two warps
    a program, vector loads, token-major; to 4k rows two heads and a warp, lane loads; from 4k to
    8k rows the slab kernel, 4 heads and 2 warps, where it fits; above, the row kernel on a
    head-major grid, also where the slab kernel fits. Heads of other sizes at the same rows
    keep the rules they had."""
    rows = b * h
    fits, row = (tuning.launch("pack", b, h, 512, n, slab_ok=ok) for ok in (True, False))
    row_shape = (row.block_h, row.block_d, row.num_warps, row.slab)
    if rows <= 2048:
        assert row_shape == (2, 512, 2, False) and not row.lane_loads and not row.head_major
        assert fits == row
    elif rows <= 4096:
        assert row_shape == (2, 512, 1, False) and row.lane_loads and not row.head_major
        assert fits == row
    elif rows <= 8192:
        assert (fits.block_h, fits.num_warps, fits.slab, fits.head_major) == (4, 2, True, False)
        assert row_shape == (1, 512, 1, False) and not row.head_major
    else:
        assert row_shape == (1, 512, 1, False) and row.head_major and fits == row
        assert row.grid(b, h) == (h, b)
    for lanes in (256, 1024):
        assert not tuning.launch("pack", b, h, lanes, n, slab_ok=True).head_major


@pytest.mark.parametrize("b, h, n", [(1, 16, 2), (1, 128, 8), (4, 64, 4), (16, 64, 8),
                                     (64, 16, 2)])
def test_decode_heads_of_512_lanes_go_two_a_program(compiled, b, h, n):
    """fp32 D=512 up to 1024 rows: two heads, 4 warps, loads in the stores' layout (256-lane
    heads at the same rows: the test below)."""
    cfg = tuning.launch("pack", b, h, 512, n)
    assert (cfg.block_h, cfg.block_d, cfg.num_warps, cfg.lane_loads, cfg.slab,
            cfg.head_major) == (2, 512, 4, True, False, False)


@pytest.mark.parametrize("b, h, n", [(1, 128, 8), (4, 64, 4), (1, 64, 8), (16, 16, 2),
                                     (1, 16, 2), (8, 64, 8), (16, 64, 8), (64, 16, 2)])
def test_decode_heads_of_256_lanes_go_four_a_program(compiled, b, h, n):
    """16-bit D=512 (256 lanes) up to 256 rows: four heads, 4 warps, loads in the stores'
    layout; above 256 rows two heads; heads of other sizes at the same rows keep their rules
    (one 256-lane program: one head of 250 lanes, four of 64)."""
    want = 4 if b * h <= 256 else 2
    assert tuning.launch("pack", b, h, 256, n) == tuning.Launch(want, 256, 4, lane_loads=True)
    if b * h <= 256:
        assert tuning.launch("pack", b, h, 250, n) == tuning.Launch(1, 256, 4, lane_loads=True)
        assert tuning.launch("pack", b, h, 64, n) == tuning.Launch(4, 64, 4, lane_loads=True)


@pytest.mark.parametrize("b, h, n", [(1, 16, 2), (1, 64, 4), (4, 16, 2), (1, 128, 8),
                                     (4, 64, 8), (16, 16, 2), (16, 64, 4), (64, 16, 2),
                                     (128, 16, 2), (16, 128, 8)])
def test_decode_heads_of_128_lanes_go_four_a_program(compiled, b, h, n):
    """fp32 D=128 (128 lanes) from 64 to 1024 rows: four heads, 2 warps, loads in the stores'
    layout; up to 64 rows two heads and 4 warps; above 1024 rows the rules of every size (four
    heads, one warp, vector loads); heads of 120 or 250 lanes keep their rules."""
    rows, cfg = b * h, tuning.launch("pack", b, h, 128, n)
    if rows <= 64:
        assert cfg == tuning.Launch(2, 128, 4, lane_loads=True)
    elif rows <= 1024:
        assert cfg == tuning.Launch(4, 128, 2, lane_loads=True)
    else:
        assert cfg == tuning.Launch(4, 128, 1)
    if 64 < rows <= 1024:
        assert tuning.launch("pack", b, h, 120, n).num_warps == 4
        assert tuning.launch("pack", b, h, 250, n).num_warps == 4


# (B, H, N, lanes) -> (heads a program, warps): the 17 decode rows, as the table's comment
# (sixteenth and seventeenth passes) states the measured choices; lanes are 32-bit words
# (16-bit D=512: 256, fp32 D=128: 128, 16-bit D=128: 64, 16-bit D=64: 32).
COMBINE_DECODE = [
    ((1, 128, 8, 256), (1, 8)),      # up to 128 rows: 8 warps
    ((16, 128, 8, 256), (1, 4)),     # 256 rows of 256-lane heads: 4 warps
    ((32, 128, 8, 256), (1, 1)),     # 512 rows of 256-lane heads: one warp
    ((64, 128, 8, 256), (1, 1)),     # 1024 rows, N = 8: one warp
    ((64, 64, 4, 256), (1, 2)),      # 1024 rows, N = 4: 2 warps (half the loads in flight)
    ((32, 64, 2, 256), (1, 2)),      # 1024 rows, N = 2: as N = 4
    ((128, 64, 4, 256), (1, 2)),     # 2048 rows: 2 warps whatever N
    ((128, 128, 8, 256), (1, 2)),
    ((512, 128, 8, 256), (1, 4)),    # 8192 rows: 4 warps
    ((64, 32, 4, 64), (2, 2)),       # 32-128 lanes from 512 to 2048 rows: two heads a program
    ((64, 32, 4, 128), (2, 4)),
    ((128, 32, 4, 32), (2, 2)),
    ((128, 16, 2, 64), (2, 2)),
    # eighteenth pass (the grid's points slower than the engine design): up to 128 rows 4 warps
    # for heads of at most 128 lanes and for 256-lane heads in groups of at most 4
    ((1, 64, 8, 64), (1, 4)), ((4, 128, 8, 128), (1, 4)), ((4, 64, 4, 256), (1, 4)),
    ((4, 16, 2, 256), (1, 4)), ((4, 128, 8, 256), (1, 8)), ((4, 16, 2, 512), (1, 8)),
    # 129-256 rows: 128 lanes a program at 4 warps for heads of at most 64 lanes, 2 warps for
    # 128-lane heads
    ((32, 64, 8, 32), (4, 4)), ((16, 64, 4, 64), (2, 4)), ((32, 16, 2, 40), (2, 4)),
    ((16, 128, 8, 128), (1, 2)),
    # fp32 D=512 in groups of 8 from 129 to 512 rows: 2 warps (4 in smaller groups)
    ((16, 128, 8, 512), (1, 2)), ((32, 128, 8, 512), (1, 2)), ((32, 64, 4, 512), (1, 4)),
    # groups of 2: 4 warps for 256-lane heads to 512 rows, 512-lane heads to 1024 rows
    ((64, 16, 2, 256), (1, 4)), ((128, 16, 2, 512), (1, 4)),
    # 2k-16k rows: four heads of at most 64 lanes and 2 warps a program; 256-lane heads in
    # groups of 2 two heads and one warp
    ((512, 16, 2, 40), (4, 2)), ((1024, 32, 4, 32), (4, 2)), ((1024, 64, 4, 64), (4, 2)),
    ((1024, 128, 8, 64), (4, 2)), ((1024, 16, 2, 256), (2, 1)), ((1024, 64, 4, 256), (1, 4)),
    ((1024, 64, 4, 128), (1, 4)),
    # ... except 40-lane heads to 4096 rows in groups of 8: one head and 2 warps
    ((256, 128, 8, 40), (1, 2)), ((512, 128, 8, 40), (4, 2)), ((256, 128, 8, 64), (4, 2)),
    ((256, 64, 4, 40), (4, 2)),
    # nineteenth pass (the eighteenth pass's grid): 256-lane heads at 257-512 rows in groups
    # of 4: 4 warps; 512-lane heads at 513-1024 rows: 4 warps in groups of 4, 2 in groups of
    # 8; 128-lane heads in groups of 2 at 2049-4096 rows: four heads and 4 warps a program
    ((32, 64, 4, 256), (1, 4)), ((64, 32, 4, 256), (1, 4)), ((32, 128, 8, 256), (1, 1)),
    ((128, 32, 4, 512), (1, 4)), ((64, 64, 4, 512), (1, 4)), ((64, 128, 8, 512), (1, 2)),
    ((128, 64, 8, 512), (1, 2)), ((512, 16, 2, 128), (4, 4)), ((512, 32, 4, 128), (1, 2)),
]


@pytest.mark.parametrize("shape, want", COMBINE_DECODE)
def test_decode_combines_take_the_measured_launches(compiled, shape, want):
    """The combine's launches up to 16k rows: heads a program and warps by rows, head lanes
    and (where the measurements split on it) the group's size; the whole head in one tile."""
    b, h, n, lanes = shape
    cfg = tuning.combine_launch(n, b, h // n, lanes)
    assert (cfg.block_h, cfg.num_warps) == want and cfg.block_d == next_pow2(lanes), cfg


def test_every_problem_gets_a_launch(compiled):
    """Zero rows too (an empty batch): rules with row bounds must not leave it without one."""
    for kind in ("pack", "combine", "scale"):
        for b, lanes in ((0, 512), (0, 256), (1, 512), (10**6, 512)):
            assert tuning.launch(kind, b, 16, lanes, 2, slab_ok=kind == "pack").num_warps >= 1


def test_head_major_grids_hold_their_tokens(compiled):
    """A head-major grid has its tokens on CUDA's second axis (at most 65535): beyond that the
    launch is token-major (the same bytes, programs in another order)."""
    for b in (65535, 65536, 200000):
        cfg = tuning.launch("pack", b, 16, 512, 2)
        assert cfg.head_major == (b <= 65535)
        grid = cfg.grid(b, 16)
        assert grid[1 if cfg.head_major else 0] == b and max(grid[1:]) <= 65535
    tuning.OVERRIDES["pack"] = tuning.Launch(1, 1024, 1, head_major=True)
    try:
        assert not tuning.launch("pack", 70000, 16, 512, 2).head_major
        assert tuning.launch("pack", 7, 16, 512, 2).head_major
    finally:
        tuning.OVERRIDES.clear()


def test_small_slab_programs_take_the_row_kernel(compiled):
    """D=64 16-bit with 8 heads a peer: a chunk is 256 lanes, which lost to the row kernel;
    every_launch still lists the slab launch (the tests run it whatever its size)."""
    assert not tuning.launch("pack", 8192, 64, 32, 8, slab_ok=True).slab
    every = tuning.every_launch("pack", 8192, 64, 32, 8, slab_ok=True)
    assert {c.block_h for c in every if c.slab} == {8}
    assert not any(c.slab for c in tuning.every_launch("pack", 8192, 64, 32, 8))


@pytest.mark.parametrize("per_peer", [4, 8, 12, 16, 20, 48])
def test_slab_heads_divide_a_peers_heads(per_peer):
    for block in (1, 4, 8, 16, 64):
        g = tuning.slab_heads(block, per_peer * 2, 2)
        assert g >= 4 and per_peer % g == 0 and g & (g - 1) == 0 and (g <= block or g == 4)


@pytest.mark.parametrize("b, h, n, lanes, lane_loads", [
    (1, 128, 8, 256, True),    # D=512 16-bit at B=1
    (4, 64, 4, 128, True),     # D=128 fp32
    (16, 64, 4, 256, True),    # 1024 rows of 256-lane heads
    (1, 128, 8, 512, True),    # D=512 fp32 (two heads a program) up to 1024 rows
    (16, 64, 4, 512, True),
    (32, 64, 4, 512, False),   # ... and above: vector loads, but from 2k to 4k rows
    (64, 64, 4, 512, True),
    (64, 64, 4, 64, False),    # above 1024 rows
    (8192, 64, 4, 256, False),
])
def test_decode_packs_load_in_the_stores_layout(compiled, b, h, n, lanes, lane_loads):
    """Up to 1024 rows the pack's loads are single lanes in the layout of its stores (and for
    512-lane heads from 2k to 4k rows)."""
    assert tuning.launch("pack", b, h, lanes, n).lane_loads == lane_loads
    every = tuning.every_launch("pack", b, h, lanes, n)
    assert {c.lane_loads for c in every} == {True, False}  # the tests run both


def test_launch_choices_are_cached_for_the_table_in_force(compiled, monkeypatch):
    """An eager call looks its launch up: the same object for the same problem, and
    a fresh choice whenever the rules in force change (a swapped table, the interpreter, an
    override), never a stale one."""
    args = ("combine", 64, 16, 256, 8)
    first = tuning.launch(*args)
    assert tuning.launch(*args) is first
    assert first == tuning.Launch(1, 256, 1)  # one head a program, one warp at 1k rows
    other = tuning.CANDIDATES["combine_one_tile"]  # a table whose rule above 16k rows differs
    big = ("combine", 8192, 16, 256, 4)
    table_big = tuning.launch(*big)
    monkeypatch.setattr(tuning, "ACTIVE", other)
    assert tuning.launch(*big) == tuning.Rule(tuning._ANY, 256, 1024, 8).launch(8192, 16, 256, 4)
    assert tuning.launch(*big) != table_big
    monkeypatch.setattr(tuning, "ACTIVE", tuning.H200.rules)
    assert tuning.launch(*big) == table_big
    monkeypatch.setitem(tuning.OVERRIDES, "combine", tuning.Launch(2, 64, 2))
    assert tuning.launch(*args) == tuning.Launch(2, 64, 2)
    monkeypatch.delitem(tuning.OVERRIDES, "combine")
    assert tuning.launch(*args) == first
    monkeypatch.setattr(tuning._env, "INTERPRET", True)
    assert tuning.launch(*args) == tuning.INTERPRETER["combine"].launch(64, 16, 256, 8)


@pytest.mark.parametrize("lanes,split,block_d,programs", [
    (512, 2, 256, 2), (256, 4, 64, 4), (12, 2, 8, 2), (12, 4, 4, 3), (40, 2, 32, 2)])
def test_a_split_override_covers_the_head_once(monkeypatch, lanes, split, block_d, programs):
    """An override asking for ``split_d`` gets tiles of the head's power of two over split_d,
    as many programs a row as cover its lanes (the last tile masked where they do not fill
    it), and a grid whose third axis walks them; the kernel trusts block_d x split_d >= lanes."""
    monkeypatch.setattr(tuning._env, "INTERPRET", False)
    monkeypatch.setitem(tuning.OVERRIDES, "combine", tuning.Launch(1, 0, 2, split_d=split))
    cfg = tuning.combine_launch(4, 3, 8, lanes)
    assert (cfg.block_d, cfg.split_d) == (block_d, programs)
    assert cfg.block_d * cfg.split_d >= lanes > cfg.block_d * (cfg.split_d - 1)
    assert cfg.grid(3, 8) == (3, 8, programs)
    assert tuning.Launch(1, 64, 2).grid(3, 8) == (3, 8)


def test_split_is_the_combines_alone(monkeypatch):
    monkeypatch.setitem(tuning.OVERRIDES, "pack", tuning.Launch(1, 0, 2, split_d=2))
    with pytest.raises(ValueError, match="only the combine"):
        tuning.pack_launch(3, 8, 64, 4)


@pytest.mark.parametrize("b, h, n, lanes", [(64, 16, 8, 256), (64, 16, 4, 256), (256, 16, 8, 256),
                                            (512, 16, 8, 256), (8192, 16, 4, 256),
                                            (100_000, 8, 2, 64)])
def test_head_major_candidate_differs_only_in_the_grids_order(compiled, monkeypatch,
                                                             b, h, n, lanes):
    """The bench's ``combine_head_major`` table: the table's launch at every problem, on a
    head-major grid where a rule of more than 1024 rows takes it, token-major where the token
    blocks exceed a grid's second axis (65535)."""
    table = tuning.combine_launch(n, b, h, lanes)
    monkeypatch.setattr(tuning, "ACTIVE", tuning.CANDIDATES["combine_head_major"])
    cand = tuning.combine_launch(n, b, h, lanes)
    assert replace(cand, head_major=False) == table and not table.head_major
    assert cand.head_major == (b * h > 1024 and b <= 65535)
    assert cand.grid(b, h) == (table.grid(b, h)[::-1] if cand.head_major else table.grid(b, h))


# --------------------------------------------------------------------------- the tables' files
_CATCH_ALL = {"max_rows": "any", "block_d_cap": 1024, "lanes": 4096, "num_warps": 8}


def _table(card=None, **rules):
    """A table file's JSON: ``rules`` by kind (every kind a catch-all rule where not given)."""
    kinds = {k: rules.get(k, [dict(_CATCH_ALL)]) for k in tuning.KINDS}
    return {"format": 1, "card": card, "rules": kinds}


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_every_shipped_table_reads_and_each_card_has_its_file():
    """Every file in launch_tables/ passes the checks, names its card (the default excepted)
    and is the file a device of that name looks up; the H200's table is the one in the code's
    history (its pack rules end in the row kernel's catch-all)."""
    tables = tuning.shipped_tables()
    assert tuning.DEFAULT_TABLE in tables and "NVIDIA_H200.json" in tables
    for name, table in tables.items():
        assert set(table.rules) == set(tuning.KINDS)
        for kind, rules in table.rules.items():
            assert rules and tuning._takes_every_problem(rules[-1]), (name, kind)
        if table.card is not None:
            found, why = tuning.table_for_card(table.card["name"],
                                               tuple(table.card["capability"]),
                                               table.card["sms"])
            assert found is table and "the device's name" in why
    assert tables["NVIDIA_H200.json"].rules == tuning.H200.rules


def test_rules_read_back_as_written():
    """rule_to_json and rule_from_json are inverses over every rule of every table and bench
    candidate (what a sweep writes is what a process then reads)."""
    rules = {(kind, r) for t in tuning.CANDIDATES.values() for kind, rs in t.items() for r in rs
             if kind != "scale"}
    for kind, rule in rules:
        assert tuning.rule_from_json(json.loads(json.dumps(tuning.rule_to_json(rule))),
                                     kind) == rule


@pytest.mark.parametrize("kind, rule, says", [
    ("pack", {"max_rows": 64, "block_d_cap": 1024, "lanes": 1, "num_warps": 4, "warps": 2},
     "unknown field"),
    ("pack", {"max_rows": 64, "block_d_cap": 1024, "lanes": 1, "num_warps": 3},
     "num_warps is one of"),
    ("pack", {"max_rows": 64, "block_d_cap": 1000, "lanes": 1, "num_warps": 4},
     "block_d_cap is a power of two"),
    ("pack", {"max_rows": -1, "block_d_cap": 1024, "lanes": 1, "num_warps": 4}, "max_rows"),
    ("pack", {"block_d_cap": 1024, "lanes": 1, "num_warps": 4}, "missing max_rows"),
    ("pack", {"max_rows": 64, "block_d_cap": 1024, "lanes": 1, "num_warps": 4,
              "lane_loads": 1}, "lane_loads is true or false"),
    ("pack", {"max_rows": 64, "block_d_cap": 1024, "lanes": 1, "num_warps": 4,
              "min_head_lanes": 64, "max_head_lanes": 32}, "no problem fits"),
    ("pack", {"max_rows": 64, "block_d_cap": 1024, "lanes": 1, "num_warps": 4,
              "min_rows": 64}, "min_rows"),
    ("combine", {"max_rows": 64, "block_d_cap": 512, "lanes": 1, "num_warps": 4,
                 "slab": True, "slab_warps": [[0, 0, 2]]}, "the pack kernel(s) only"),
    ("pack", {"max_rows": 64, "block_d_cap": 1024, "lanes": 1, "num_warps": 4,
              "split_d": 2}, "the combine kernel(s) only"),
    ("scale", {"max_rows": 64, "block_d_cap": 512, "lanes": 1, "num_warps": 4,
               "head_major": True}, "not of the scale kernel"),
    ("pack", {"max_rows": 64, "block_d_cap": 1024, "lanes": 1, "num_warps": 4, "slab": True,
              "slab_warps": [[1024, 0, 4]]}, "must end in [0, 0, warps]"),
    ("pack", {"max_rows": 64, "block_d_cap": 1024, "lanes": 1, "num_warps": 4, "slab": True},
     "needs slab_warps"),
])
def test_a_bad_rule_is_named_with_its_file(tmp_path, kind, rule, says):
    """A rule the launchers could not use (an unknown field, warps a GPU does not take, an
    option of another kernel, a slab rule that gives no warps) is refused when the table is
    read: TableError naming the file, the kind, the rule's index and the rule."""
    doc = _table(**{kind: [rule, dict(_CATCH_ALL)]})
    path = _write(tmp_path / "NVIDIA_X.json", doc)
    with pytest.raises(tuning.TableError) as e:
        tuning.read_table(path)
    msg = str(e.value)
    assert str(path) in msg and f"{kind} rule 0" in msg and says in msg, msg


@pytest.mark.parametrize("edit, says", [
    (lambda d: d["rules"]["combine"].pop(), "is the last and must take every problem"),
    (lambda d: d["rules"]["pack"].__setitem__(0, {**_CATCH_ALL, "max_ranks": 4}),
     "must take every problem"),
    (lambda d: d["rules"].pop("scale"), "no rules for scale"),
    (lambda d: d.__setitem__("format", 2), "format 2"),
    (lambda d: d.__setitem__("extra", 1), "unknown key(s) extra"),
    (lambda d: d.__setitem__("card", {"name": "X"}), "card is null or"),
    (lambda d: d["rules"].__setitem__("gather", [dict(_CATCH_ALL)]), "rules is an object"),
])
def test_a_bad_table_is_named(tmp_path, edit, says):
    """A table that could leave a problem without a launch (a kind whose last rule has bounds,
    a kind missing) or that this code cannot read is refused with its file named."""
    doc = _table(combine=[{**_CATCH_ALL, "max_rows": 64}, dict(_CATCH_ALL)])
    edit(doc)
    path = _write(tmp_path / "t.json", doc)
    with pytest.raises(tuning.TableError, match=re.escape(says)) as e:
        tuning.read_table(path)
    assert str(path) in str(e.value)


def test_a_table_file_that_is_not_json_or_missing_is_named(tmp_path):
    (tmp_path / "t.json").write_text('{"format": 1,')
    with pytest.raises(tuning.TableError, match="t.json: not JSON"):
        tuning.read_table(tmp_path / "t.json")
    with pytest.raises(tuning.TableError, match="cannot be read.*NVIDIA_H200.json"):
        tuning.read_table("NO_SUCH_CARD.json")


def test_a_base_gives_the_kinds_a_table_does_not_list(tmp_path):
    """``base``: the kinds a table leaves out come from that table (the default is the H200's
    this way); a chain of bases that comes back to a table is refused."""
    own = [{**_CATCH_ALL, "num_warps": 2}]
    _write(tmp_path / "base.json", _table(combine=[{**_CATCH_ALL, "num_warps": 4}]))
    top = _write(tmp_path / "top.json",
                 {"format": 1, "card": None, "base": "base.json", "rules": {"pack": own}})
    t = tuning.read_table(top)
    assert t.rules["pack"][0].num_warps == 2 and t.rules["combine"][0].num_warps == 4
    assert tuning.read_table(tuning.DEFAULT_TABLE).rules == tuning.H200.rules
    _write(tmp_path / "base.json", {"format": 1, "card": None, "base": "top.json"})
    with pytest.raises(tuning.TableError, match="comes back to it"):
        tuning.read_table(top)


@pytest.fixture
def tables_dir(tmp_path, monkeypatch):
    """launch_tables/ in ``tmp_path`` (the shipped tables forgotten meanwhile)."""
    monkeypatch.setattr(tuning, "TABLES_DIR", tmp_path)
    monkeypatch.setattr(tuning, "_SHIPPED", {})
    _write(tmp_path / "default.json", _table())
    return tmp_path


def _card(name, sms=132, cap=(9, 0)):
    return {"name": name, "capability": list(cap), "sms": sms}


def test_a_card_takes_its_file_else_one_of_its_kind_else_the_default(tables_dir):
    """By the device's name first; else the one table whose card has the device's compute
    capability and SM count; several (an H100 and an H200 are both 9.0 with 132 SMs) or none:
    the default, saying why."""
    _write(tables_dir / "NVIDIA_H200.json", _table(_card("NVIDIA H200")))
    _write(tables_dir / "NVIDIA_L40S.json", _table(_card("NVIDIA L40S", 142, (8, 9))))
    shipped = tuning.shipped_tables()
    assert set(shipped) == {"default.json", "NVIDIA_H200.json", "NVIDIA_L40S.json"}
    t, why = tuning.table_for_card("NVIDIA H200", (9, 0), 132)
    assert t.name == "NVIDIA_H200.json" and "name" in why
    t, why = tuning.table_for_card("NVIDIA H100 80GB HBM3", (9, 0), 132)
    assert t.name == "NVIDIA_H200.json" and "compute capability 9.0 and 132 SMs" in why
    t, why = tuning.table_for_card("NVIDIA L40", (8, 9), 142)
    assert t.name == "NVIDIA_L40S.json"
    _write(tables_dir / "NVIDIA_H100_80GB_HBM3.json", _table(_card("NVIDIA H100 80GB HBM3")))
    tuning._SHIPPED.clear()
    t, why = tuning.table_for_card("NVIDIA H800", (9, 0), 132)
    assert t.name == "default.json" and "as 2 tables' cards" in why
    t, why = tuning.table_for_card("NVIDIA A100-SXM4-80GB", (8, 0), 108)
    assert t.name == "default.json" and "no table for it" in why
    assert tuning.card_file_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3.json"
    assert tuning.card_file_name("NVIDIA A100-SXM4-80GB") == "NVIDIA_A100_SXM4_80GB.json"


def test_a_shipped_table_is_named_after_its_card(tables_dir):
    _write(tables_dir / "NVIDIA_H100.json", _table(_card("NVIDIA H200")))
    with pytest.raises(tuning.TableError, match="NVIDIA_H100.json: the file of card "
                                                "'NVIDIA H200' is NVIDIA_H200.json"):
        tuning.shipped_tables()


@pytest.fixture
def untaken(monkeypatch):
    """This process as before its first compiled launch: no table taken, TABLE the default's
    (a dict of its own), ACTIVE = TABLE, the launch cache empty."""
    table = dict(tuning.read_table(tuning.DEFAULT_TABLE).rules)
    monkeypatch.setattr(tuning, "_IN_FORCE", [])
    monkeypatch.setattr(tuning, "TABLE", table)
    monkeypatch.setattr(tuning, "ACTIVE", table)
    monkeypatch.setattr(tuning, "_CHOSEN", {})
    monkeypatch.setattr(tuning._env, "INTERPRET", False)
    return table


def test_the_first_compiled_launch_takes_the_devices_table_once(untaken, tables_dir,
                                                                monkeypatch):
    """The device's table is taken at the first compiled launch (TABLE updated in place, so
    ACTIVE and the bench's "table" see it) and never again: a later change of device or of
    DCP_A2A_LAUNCH_TABLE changes nothing in this process (a captured CUDA graph replays the
    launch it captured)."""
    one_warp = [{**_CATCH_ALL, "num_warps": 1}]
    _write(tables_dir / "NVIDIA_H200.json", _table(_card("NVIDIA H200"), combine=one_warp))
    device = ["NVIDIA H200"]
    monkeypatch.setattr(tuning, "_device_table",
                        lambda: tuning.table_for_card(device[0], (9, 0), 132))
    cfg = tuning.launch("combine", 64, 16, 256, 8)
    assert cfg.num_warps == 1 and untaken["combine"][0].num_warps == 1
    table, why = tuning.table_in_force()
    assert table.name == "NVIDIA_H200.json" and tuning.ACTIVE is untaken
    device[0] = "NVIDIA B200"
    monkeypatch.setenv(tuning.TABLE_ENV, "default.json")
    assert tuning.table_in_force()[0] is table
    assert tuning.launch("combine", 128, 16, 256, 8).num_warps == 1


def test_the_environment_chooses_a_table(untaken, tables_dir, monkeypatch):
    """DCP_A2A_LAUNCH_TABLE: a shipped file's name or a path, read and checked like any."""
    path = _write(tables_dir.parent / "mine.json", _table(scale=[{**_CATCH_ALL,
                                                                   "num_warps": 2}]))
    monkeypatch.setenv(tuning.TABLE_ENV, str(path))
    table, why = tuning.table_in_force()
    assert table.path == path.resolve() and tuning.TABLE_ENV in why
    assert tuning.launch("scale", 4, 8, 64).num_warps == 2


def test_a_bad_table_in_the_environment_stops_the_first_launch(untaken, monkeypatch):
    monkeypatch.setenv(tuning.TABLE_ENV, "NO_SUCH.json")
    with pytest.raises(tuning.TableError, match="NO_SUCH.json: cannot be read"):
        tuning.launch("combine", 64, 16, 256, 8)


def test_every_launch_covers_every_shipped_table(tables_dir, monkeypatch):
    """A launch only one card's table gives is among every_launch's (so the bit-for-bit tests
    run it whatever card runs them)."""
    monkeypatch.setattr(tuning._env, "INTERPRET", False)
    want = tuning.Launch(16, 64, 16)  # 16 heads of a 64-lane tile, 16 warps: no other rule's
    assert want not in tuning.every_launch("combine", 1024, 16, 256, 8)
    odd = {**_CATCH_ALL, "lanes": 2048, "num_warps": 16, "block_d_cap": 64}
    _write(tables_dir / "NVIDIA_H200.json", _table(_card("NVIDIA H200"), combine=[odd]))
    tuning._SHIPPED.clear()
    assert want in tuning.every_launch("combine", 1024, 16, 256, 8)


_LAUNCHES = [  # (kind, launch as an override asks for it, B, heads, lanes, N, slab fits)
    ("combine", tuning.Launch(1, 1 << 30, 4), 64, 16, 256, 8, False),
    ("combine", tuning.Launch(2, 1 << 30, 2), 128, 8, 64, 4, False),
    ("combine", tuning.Launch(1, 1 << 30, 2, head_major=True), 256, 8, 64, 4, False),
    ("combine", tuning.Launch(1, 0, 2, split_d=2), 64, 16, 256, 8, False),
    ("combine", tuning.Launch(1, 0, 1, split_d=4), 1, 16, 256, 8, False),
    ("pack", tuning.Launch(4, 1 << 30, 4, lane_loads=True), 1, 128, 256, 8, True),
    ("pack", tuning.Launch(1, 1 << 30, 8), 16, 128, 256, 8, True),
    ("pack", tuning.Launch(2, 1 << 30, 1, head_major=True), 64, 32, 128, 4, False),
    ("pack", tuning.Launch(16, 1 << 30, 16, slab=True), 8192, 64, 256, 4, True),
    ("pack", tuning.Launch(8, 1 << 30, 4, slab=True), 256, 32, 64, 4, True),
    ("scale", tuning.Launch(4, 1 << 30, 4), 64, 32, 128, 1, False),
]


@pytest.mark.parametrize("kind, want, b, h, lanes, n, slab_ok", _LAUNCHES)
def test_an_exact_rule_gives_its_launch_at_its_problem_only(monkeypatch, kind, want, b, h,
                                                            lanes, n, slab_ok):
    """exact_rule (what a sweep writes for a problem it timed): the launch the override gave
    there, as a table reads it back, and nothing at one row, one lane or one rank more (the
    table's other rules decide those)."""
    monkeypatch.setattr(tuning._env, "INTERPRET", False)
    monkeypatch.setitem(tuning.OVERRIDES, kind, want)
    cfg = tuning.launch(kind, b, h, lanes, n, slab_ok)
    monkeypatch.delitem(tuning.OVERRIDES, kind)
    rule = tuning.exact_rule(kind, cfg, b, h, lanes, n, slab_ok)
    read = tuning.rule_from_json(json.loads(json.dumps(tuning.rule_to_json(rule))), kind)
    table = {**tuning.H200.rules, kind: (read,) + tuning.H200.rules[kind]}
    monkeypatch.setattr(tuning, "ACTIVE", table)
    assert tuning.launch(kind, b, h, lanes, n, slab_ok) == cfg
    for other in ((b + 1, h, lanes, n), (b - 1, h, lanes, n), (b, h, lanes + 1, n),
                  (b, h, lanes, n + 1)):
        assert read.launch(*other, slab_ok) is None or other[0] * other[1] > read.max_rows
    if cfg.split_d > 1:
        assert read.split_d > 1 and cfg.block_d * cfg.split_d >= lanes


def test_an_exact_rule_refuses_a_launch_no_rule_gives():
    """A launch a rule cannot produce (a tile wider than the head's power of two) is refused,
    not written as a rule that would give something else."""
    with pytest.raises(ValueError, match="no rule gives the combine launch"):
        tuning.exact_rule("combine", tuning.Launch(1, 512, 4), 64, 16, 256, 8)
