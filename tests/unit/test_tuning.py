"""The launch table's rules (host arithmetic only: no kernel runs here)."""

from __future__ import annotations

from dataclasses import astuple

import pytest

from dcp_a2a.kernels import tuning

pytestmark = pytest.mark.unit


@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.setattr(tuning._env, "INTERPRET", False)


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


def test_interpreter_combine_spans_tokens_and_pack_does_not(interpreted):
    """1024 tokens of one head: a few combine programs, but one pack program a token (so an
    aliasing staging buffer corrupts bytes on the CPU as on a GPU)."""
    comb = tuning.launch("combine", 1024, 1, 4, 2)
    assert comb.block_b * comb.block_h >= 512 and comb.grid(1024, 1)[0] <= 2
    pack = tuning.launch("pack", 1024, 2, 4, 2)
    assert pack.block_b == 1 and pack.grid(1024, 2) == (1024, 1)


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
