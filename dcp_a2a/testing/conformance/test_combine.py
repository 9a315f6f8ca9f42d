"""Kernel tier: unpack-combine against the float64 oracle, within the derived bound."""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.testing.data import DTYPES, heads_of, partials
from dcp_a2a.testing.exchange import exchange, merge_all, pack_all

pytestmark = [pytest.mark.kernel, pytest.mark.conformance, pytest.mark.clause("merge bound")]


@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_matches_oracle(impl, device, merge_check, dtype, n, base_e):
    """Every dtype x base x N; the output with return_lse=False is the same tensor bitwise."""
    b, h, d = 3, 2 * n, 40
    outs, lses = partials(n, b, h, d, dtype, seed=7 * n + int(base_e), device=device)
    p = impl.lse_pack_dim(dtype)
    recvs = exchange(pack_all(impl, outs, lses))
    ranks = sorted({0, n - 1})
    results = {r: impl.unpack_combine(recvs[r], d, p, True, base_e) for r in ranks}
    for r in ranks:
        out, lse = results[r]
        assert out.dtype == dtype and out.shape == (b, h // n, d)
        assert lse.dtype == torch.float32 and lse.shape == (b, h // n)
        merge_check(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(),
                    is_lse_base_on_e=base_e, heads=heads_of(r, n, h))
    alone = impl.unpack_combine(recvs[0], d, p, False, base_e)
    assert isinstance(alone, torch.Tensor)
    assert torch.equal(alone.cpu().view(torch.int16 if dtype != torch.float32 else torch.int32),
                       results[0][0].cpu().view(torch.int16 if dtype != torch.float32
                                                else torch.int32))


@pytest.mark.parametrize("d", [1, 3, 80, 96, 130, 192, 576])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_head_dims_not_powers_of_two(impl, device, merge_check, dtype, d):
    n, b, h = 2, 2, 4
    outs, lses = partials(n, b, h, d, dtype, seed=d, device=device)
    results = merge_all(impl, outs, lses, return_lse=True, base_e=True)
    for r, (out, lse) in enumerate(results):
        merge_check(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), heads=heads_of(r, n, h))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_and_inf_lses_and_empty_partials(impl, device, merge_check, dtype):
    """NaN/+inf LSEs count as -inf; ranks of weight 0 contribute nothing even when their
    partial is NaN/inf; rows where every rank is -inf give 0 and -inf."""
    n, b, h, d = 4, 5, 4, 9
    outs, lses = partials(n, b, h, d, dtype, seed=3, device=device)
    outs, lses = outs.clone(), lses.clone()
    lses[1, 0] = math.nan
    outs[1, 0] = math.nan
    lses[2, 1] = math.inf
    outs[2, 1] = math.inf
    lses[3, 2] = -math.inf
    outs[3, 2] = math.nan
    lses[:, 3] = -math.inf          # whole row empty everywhere
    outs[:, 3] = math.nan
    lses[1:, 4] = -math.inf         # a single finite rank
    outs[1:, 4] = math.nan
    results = merge_all(impl, outs, lses, return_lse=True, base_e=True)
    for r, (out, lse) in enumerate(results):
        out, lse = out.cpu(), lse.cpu()
        assert not torch.isnan(out).any()
        assert torch.all(out[3] == 0) and torch.all(lse[3] == -math.inf)
        assert torch.equal(out[4], outs[0, 4, heads_of(r, n, h)].cpu())
        merge_check(out, lse, outs.cpu(), lses.cpu(), heads=heads_of(r, n, h))


@pytest.mark.clause("masking")  # overrides the module's clause
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_shard_rows_with_nan_partials(impl, device, merge_check, dtype):
    """A rank with no local KV for some requests produces garbage (NaN) partials there; with
    seq_lens/query_start_loc the pack kernel masks them and they never reach the output."""
    n, b, h, d = 3, 6, 3, 10
    outs, lses = partials(n, b, h, d, dtype, seed=11, device=device)
    outs, lses = outs.clone(), lses.clone()
    qsl = torch.tensor([0, 2, 4, 5], dtype=torch.int32, device=device)  # row 5 is padding
    seq_lens = [torch.tensor([4, 4, 4], dtype=torch.int32, device=device) for _ in range(n)]
    seq_lens[1] = torch.tensor([4, 0, 4], dtype=torch.int32, device=device)
    outs[1, 2:4] = math.nan          # rank 1 has no KV for request 1 (rows 2, 3)
    lses[1, 2:4] = 1e30              # and a garbage LSE that would dominate if unmasked
    results = merge_all(impl, outs, lses, return_lse=True, base_e=True,
                        seq_lens=seq_lens, query_start_loc=qsl)
    expected_lses = lses.clone()
    expected_lses[1, 2:4] = -math.inf
    expected_lses[:, 5] = -math.inf
    for r, (out, lse) in enumerate(results):
        out, lse = out.cpu(), lse.cpu()
        assert torch.all(out[5] == 0) and torch.all(lse[5] == -math.inf)
        merge_check(out, lse, outs.cpu(), expected_lses.cpu(), heads=heads_of(r, n, h))


def test_zero_rows_returns_empty(impl, device):
    recv = torch.empty((2, 0, 2, 10), dtype=torch.float16, device=device)
    out, lse = impl.unpack_combine(recv, 8, 2, True, True)
    assert out.shape == (0, 2, 8) and lse.shape == (0, 2) and lse.dtype == torch.float32
