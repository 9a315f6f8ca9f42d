"""Unit tier: argument handling of the project's extras (backend=, the staging buffers)."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a import Group
from dcp_a2a.testing.data import partials

pytestmark = pytest.mark.unit


def test_project_rejects_unknown_backend(project_only):
    from dcp_a2a import lse_reduce

    outs, lses = partials(1, 2, 4, 8, torch.float16)
    with pytest.raises(ValueError, match="backend"):
        lse_reduce(outs[0], lses[0], Group(1, 0, None), backend="nccl_magic")


def test_project_rejects_bad_group(project_only):
    from dcp_a2a import lse_reduce

    outs, lses = partials(1, 2, 4, 8, torch.float16)
    with pytest.raises(TypeError, match="rank_in_group"):
        lse_reduce(outs[0], lses[0], object())
    with pytest.raises(ValueError, match="rank_in_group"):
        lse_reduce(outs[0], lses[0], Group(2, 2, None))


def test_project_refuses_aliased_staging_buffer(project_only):
    """The staging buffer must never overlap the attention output it packs (a shipped bug:
    the pack kernel overwrote its own input)."""
    from dcp_a2a import pack_send

    n, b, h, d = 2, 2, 4, 8
    workspace = torch.zeros(4096, dtype=torch.float16)
    out = workspace[: b * h * d].view(b, h, d)
    send = workspace[16: 16 + n * b * (h // n) * (d + 2)].view(n, b, h // n, d + 2)
    lse = torch.zeros(b, h)
    with pytest.raises(ValueError, match="overlaps out"):
        pack_send(out, lse, send, n, h // n, d, 2)


def test_no_process_group_for_n_above_one_is_refused_before_any_kernel(monkeypatch, device):
    """Group(2, 0, None): a ValueError naming device_group, before the pack kernel runs (it
    used to run, and torch then failed inside all_to_all_single)."""
    from dcp_a2a import lse_reduce
    from dcp_a2a.kernels import pack as pack_mod

    def no_kernel(*a, **k):
        raise AssertionError("the pack kernel ran before the group was checked")

    monkeypatch.setattr(pack_mod, "_pack_kernel", no_kernel)
    outs, lses = partials(1, 2, 4, 8, torch.float16, device=device)
    with pytest.raises(ValueError, match="device_group is None but world_size=2"):
        lse_reduce(outs[0], lses[0], Group(2, 0, None))


def test_meta_tensors_are_a_value_error():
    from dcp_a2a import lse_reduce

    out, lse = torch.empty(2, 4, 8, dtype=torch.float16, device="meta"), torch.empty(
        2, 4, device="meta")
    with pytest.raises(ValueError, match="meta tensors"):
        lse_reduce(out, lse, Group(1, 0, None))
