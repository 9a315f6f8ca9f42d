"""``lse_reduce`` on a group of one: no exchange, the merge of one state is that state."""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a import Group
from dcp_a2a.testing.data import DTYPES, assert_unmodified, partials, snapshot

pytestmark = [pytest.mark.kernel, pytest.mark.conformance, pytest.mark.clause("exchange"),
              pytest.mark.needs("lse_reduce"), pytest.mark.convention]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_world_size_one_passes_through(impl, device, dtype):
    """N = 1: no exchange; the merge of one state is that state (bitwise) and its LSE."""
    impl.envelope.require(world_size=1)
    outs, lses = partials(1, 4, 3, impl.envelope.fit_head_dim(20), dtype, device=device)
    out, lse = impl.lse_reduce(outs[0], lses[0], Group(1, 0, None), return_lse=True)
    assert torch.equal(out.cpu(), outs[0].cpu())
    assert torch.equal(lse.cpu(), lses[0].cpu())


@pytest.mark.clause("masking")  # overrides the module's clause
@pytest.mark.surface("masking", "exchange")
def test_world_size_one_masks_empty_rows(impl, device):
    impl.envelope.require(world_size=1)
    outs, lses = partials(1, 3, 2, 8, torch.float16, device=device)
    mask = dict(seq_lens=torch.tensor([3, 0], dtype=torch.int32, device=device),
                query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32, device=device))
    before = snapshot(out=outs[0], lse=lses[0], **mask)
    out, lse = impl.lse_reduce(outs[0], lses[0], Group(1, 0, None), return_lse=True, **mask)
    assert_unmodified(before, "lse_reduce")
    out, lse = out.cpu(), lse.cpu()
    assert torch.equal(out[0], outs[0, 0].cpu()) and torch.all(out[1:] == 0)
    assert torch.all(lse[1:] == -math.inf)
