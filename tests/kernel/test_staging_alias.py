"""Incident 3 (all devices): the attention output being packed lives in memory the staging
owner hands out. The project's owner notices and stages elsewhere; the carved-workspace design
that shipped corrupts its input (here: pack_send refuses the overlap)."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a import Group, StagingBuffers, lse_reduce
from dcp_a2a.testing.data import partials
from tests.gpu._designs import CarvedWorkspace

pytestmark = pytest.mark.kernel


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs"])
def test_input_inside_staging_memory(project_only, device, merge_check, backend):
    n, b, h, d = 1, 4, 4, 24
    outs, lses = partials(n, b, h, d, torch.bfloat16, device=device)
    bufs = StagingBuffers()
    lse_reduce(outs[0], lses[0], Group(1, 0, None), buffers=bufs, backend=backend)
    # the caller's output now sits inside the owner's eager send buffer
    tag = {"packed": "wire.send", "two_collective": "data.send", "ag_rs": "ag_rs.scaled"}[backend]
    region = bufs.get((b * h * (d + 2),), torch.bfloat16, device, tag)
    out = region[: b * h * d].view(b, h, d)
    out.copy_(outs[0])
    res, lse = lse_reduce(out, lses[0], Group(1, 0, None), buffers=bufs, return_lse=True,
                          backend=backend)
    merge_check(res.cpu(), lse.cpu(), outs.cpu(), lses.cpu(),
                kind="ag_rs" if backend == "ag_rs" else "a2a")
    assert torch.equal(out, outs[0]), "the input was overwritten"


@pytest.mark.xfail(strict=True, raises=(AssertionError, ValueError),
                   reason="the carved-workspace design that shipped")
def test_carved_workspace_design_breaks(project_only, device):
    n, b, h, d = 2, 4, 4, 24
    outs, lses = partials(n, b, h, d, torch.bfloat16, device=device)
    workspace = torch.empty(n * b * h * (d + 2) * 2, dtype=torch.bfloat16, device=device)
    ins = [workspace[: b * h * d].view(b, h, d), outs[1]]
    ins[0].copy_(outs[0])
    from dcp_a2a.collective import drive, lse_reduce_steps

    bufs = CarvedWorkspace(workspace)
    steps = lse_reduce_steps(ins[0], lses[0], 1, 0, buffers=bufs)
    res = drive(steps, lambda kind, payload: payload[0])
    assert torch.equal(ins[0], outs[0]) and torch.isfinite(res.float()).all()
