"""Kernel tier: every backend on an in-process group of N (dcp_a2a.inprocess runs each
backend's real local work). The contract on a group of one is the conformance suite's
(dcp_a2a/testing/conformance/test_group_of_one.py)."""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.testing.data import DTYPES, heads_of, partials




BACKENDS = ["packed", "two_collective", "ag_rs"]


@pytest.mark.kernel
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backends_in_process(project_only, device, merge_check, dtype, n, base_e):
    from dcp_a2a.inprocess import lse_reduce_in_process

    b, h, d = 3, 2 * n, 24
    outs, lses = partials(n, b, h, d, dtype, seed=n, device=device)
    results = {bk: lse_reduce_in_process(list(outs), list(lses), return_lse=True,
                                         is_lse_base_on_e=base_e, backend=bk)
               for bk in BACKENDS}
    for r in range(n):
        p_out, p_lse = results["packed"][r]
        t_out, t_lse = results["two_collective"][r]
        # one combine routine: the two A2A paths agree bit for bit
        assert torch.equal(p_out.view(torch.int16 if dtype != torch.float32 else torch.int32),
                           t_out.view(torch.int16 if dtype != torch.float32 else torch.int32))
        assert torch.equal(p_lse, t_lse)
        for bk in BACKENDS:
            out, lse = results[bk][r]
            merge_check(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), is_lse_base_on_e=base_e,
                        heads=heads_of(r, n, h), kind="ag_rs" if bk == "ag_rs" else "a2a")


@pytest.mark.kernel
@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_honour_masks(project_only, device, merge_check, backend):
    from dcp_a2a.inprocess import lse_reduce_in_process

    n, b, h, d = 2, 5, 4, 8
    outs, lses = partials(n, b, h, d, torch.bfloat16, seed=2, device=device)
    outs, lses = outs.clone(), lses.clone()
    qsl = torch.tensor([0, 2, 4], dtype=torch.int32, device=device)   # row 4 is padding
    seq_lens = [torch.tensor([3, 3], dtype=torch.int32, device=device),
                torch.tensor([0, 3], dtype=torch.int32, device=device)]
    outs[1, :2] = math.nan
    lses[1, :2] = 50.0
    res = lse_reduce_in_process(list(outs), list(lses), return_lse=True, seq_lens=seq_lens,
                                query_start_loc=qsl, backend=backend)
    want_lses = lses.clone()
    want_lses[1, :2] = -math.inf
    want_lses[:, 4] = -math.inf
    for r, (out, lse) in enumerate(res):
        assert torch.all(out[4].cpu() == 0) and torch.all(lse[4].cpu() == -math.inf)
        merge_check(out.cpu(), lse.cpu(), outs.cpu(), want_lses.cpu(), heads=heads_of(r, n, h),
                    kind="ag_rs" if backend == "ag_rs" else "a2a")


@pytest.mark.kernel
@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_zero_rows(project_only, device, backend):
    from dcp_a2a.inprocess import lse_reduce_in_process

    outs, lses = partials(2, 0, 4, 8, torch.float16, device=device)
    res = lse_reduce_in_process(list(outs), list(lses), return_lse=True, backend=backend)
    for out, lse in res:
        assert out.shape == (0, 2, 8) and lse.shape == (0, 2)
