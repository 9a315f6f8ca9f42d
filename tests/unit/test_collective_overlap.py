"""Unit tier: the conformance ranks' check that no collective receives into memory it sends
from (dcp_a2a/testing/conformance/_ranks.py). The gloo groups of one GPU stage CUDA tensors
through host memory and hide that race, so the suite checks the buffers themselves."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from dcp_a2a.testing.conformance._ranks import _WATCHED, overlap_problem, watch_collectives
from dcp_a2a.testing.mirror import MirrorGroup

pytestmark = pytest.mark.unit


def test_an_all_to_all_may_share_no_byte():
    buf = torch.zeros(64)
    assert overlap_problem("a2a", buf[:32], buf[32:]) is None
    assert "overlaps" in overlap_problem("a2a", buf[:32], buf[:32])
    assert "overlaps" in overlap_problem("a2a", buf[:32], buf[31:63])  # one shared element
    assert overlap_problem("a2a", torch.zeros(8), torch.zeros(8)) is None


def test_gather_and_scatter_allow_only_the_in_place_chunk():
    out = torch.zeros(4, 8)
    assert overlap_problem("gather", out.view(-1), out[2]) is None  # chunk 2: in place
    assert "overlaps" in overlap_problem("gather", out.view(-1), out.view(-1)[4:12])
    assert overlap_problem("scatter", out[1], out.view(-1)) is None
    assert "overlaps" in overlap_problem("scatter", out.view(-1)[3:11], out.view(-1))
    assert "overlaps" in overlap_problem("a2a", out[1], out.view(-1))


def test_the_watch_sees_calls_through_torch_distributed(monkeypatch):
    for name, _ in _WATCHED:  # restored after the test
        for mod in (c10d, dist):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, getattr(mod, name))
    seen = []
    watch_collectives(seen)
    pg = MirrorGroup(2, 0)
    send = torch.arange(8.0).view(2, 4)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=pg)
    assert seen == [] and torch.equal(recv, send[0].expand(2, 4))  # still does the collective
    dist.all_to_all_single(send, send, group=pg)
    assert len(seen) == 1 and seen[0].startswith("all_to_all_single: its output")
