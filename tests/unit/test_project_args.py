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


def _pack_call(**change):
    """pack_send's arguments for a group of 2, H=4, D=8, float16, with ``change`` applied."""
    outs, lses = partials(1, 2, 4, 8, torch.float16)
    a = dict(out=outs[0], lse=lses[0], send=torch.empty(2, 2, 2, 10, dtype=torch.float16),
             world_size=2, h_per_rank=2, head_dim=8, lse_pack_dim=2)
    a.update(change)
    return a


@pytest.mark.parametrize("case", ["dtype_name", "out_none", "world_size_float", "recv_list"])
def test_project_wrong_types_are_a_type_error(project_only, case):
    """A value of the wrong type is a TypeError naming the argument (not an AttributeError or a
    Triton error from deep inside)."""
    import dcp_a2a

    with pytest.raises(TypeError, match={"dtype_name": "torch.dtype", "out_none": "out must be",
                                         "world_size_float": "world_size",
                                         "recv_list": "recv must be"}[case]):
        if case == "dtype_name":
            dcp_a2a.lse_pack_dim("float16")
        elif case == "out_none":
            dcp_a2a.pack_send(**_pack_call(out=None))
        elif case == "world_size_float":
            dcp_a2a.pack_send(**_pack_call(world_size=2.0))
        else:
            dcp_a2a.unpack_combine([torch.zeros(2, 2, 10)], 8, 2, False, True)


def test_project_refuses_an_empty_head_dim(project_only):
    from dcp_a2a import pack_send

    outs, lses = partials(1, 2, 4, 0, torch.float16)
    with pytest.raises(ValueError, match="head_dim"):
        pack_send(**_pack_call(out=outs[0], lse=lses[0], head_dim=0,
                               send=torch.empty(2, 2, 2, 2, dtype=torch.float16)))


def test_project_cpu_tensors_without_the_interpreter_are_a_value_error(project_only,
                                                                       monkeypatch):
    """With TRITON_INTERPRET off, CPU tensors would reach Triton's compiler (which has no CPU
    target): a ValueError saying what to set instead."""
    from dcp_a2a import _env, pack_send

    monkeypatch.setattr(_env, "INTERPRET", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        pack_send(**_pack_call())


def test_project_a_foreign_group_object_needs_torch_distributed(project_only, device):
    """A device_group that is not a ProcessGroup is taken as a duck-typed group only once
    torch.distributed is initialised; before that, a ValueError saying so."""
    import torch.distributed as dist

    from dcp_a2a import lse_reduce

    if dist.is_initialized():
        pytest.skip("this test process has a default process group")
    outs, lses = partials(1, 2, 4, 8, torch.float16, device=device)
    with pytest.raises(ValueError, match="init_process_group"):
        lse_reduce(outs[0], lses[0], Group(2, 0, object()))
