"""Kernel tier: unpack-combine against the float64 oracle, within the derived bound."""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.testing.data import DTYPES, heads_of, partials
from dcp_a2a.testing.exchange import merge_all

pytestmark = [pytest.mark.kernel, pytest.mark.conformance, pytest.mark.clause("merge bound")]


@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_matches_oracle(impl, device, merge_check, dtype, n, base_e):
    """Every dtype x base x N; the output with return_lse=False is the same tensor bitwise."""
    impl.envelope.require(base_e=base_e)
    b, h, d = 3, 2 * n, impl.envelope.fit_head_dim(40)
    outs, lses = partials(n, b, h, d, dtype, seed=7 * n + int(base_e), device=device)
    ranks = sorted({0, n - 1})
    merged = merge_all(impl, outs, lses, return_lse=True, base_e=base_e, ranks=set(ranks))
    results = {r: merged[r] for r in ranks}
    for r in ranks:
        out, lse = results[r]
        assert out.dtype == dtype and out.shape == (b, h // n, d)
        assert lse.dtype == torch.float32 and lse.shape == (b, h // n)
        merge_check(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(),
                    is_lse_base_on_e=base_e, heads=heads_of(r, n, h))
    alone = merge_all(impl, outs, lses, return_lse=False, base_e=base_e, ranks={0})[0]
    if isinstance(alone, tuple) and len(alone) == 2 and alone[1] is None:
        alone = alone[0]  # (out, None): a merge that always returns a pair
    assert isinstance(alone, torch.Tensor)
    assert torch.equal(alone.cpu().view(torch.int16 if dtype != torch.float32 else torch.int32),
                       results[0][0].cpu().view(torch.int16 if dtype != torch.float32
                                                else torch.int32))


@pytest.mark.parametrize("d", [1, 3, 80, 96, 130, 192, 576])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_head_dims_not_powers_of_two(impl, device, merge_check, dtype, d):
    """Any head dim D >= 1 (MLA's 576 = 512 + 64, odd ones): a kernel that assumes a power of two
    drops or repeats lanes."""
    impl.envelope.require(head_dim=d)
    n, b, h = 2, 2, 4
    outs, lses = partials(n, b, h, d, dtype, seed=d, device=device)
    results = merge_all(impl, outs, lses, return_lse=True, base_e=impl.envelope.base_e)
    for r, (out, lse) in enumerate(results):
        merge_check(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), heads=heads_of(r, n, h),
                    is_lse_base_on_e=impl.envelope.base_e)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_partials_weigh_nothing(impl, device, merge_check, dtype):
    """Ranks of LSE -inf contribute nothing even when their partial is NaN/inf; rows where every
    rank is -inf give 0 (never NaN); a single finite rank gives its partial exactly."""
    n, b, h, d = 4, 4, 4, impl.envelope.fit_head_dim(9)
    outs, lses = partials(n, b, h, d, dtype, seed=3, device=device)
    outs, lses = outs.clone(), lses.clone()
    lses[3, 0] = -math.inf
    outs[3, 0] = math.nan
    lses[2, 1] = -math.inf
    outs[2, 1] = math.inf
    lses[:, 2] = -math.inf          # whole row empty everywhere
    outs[:, 2] = math.nan
    lses[1:, 3] = -math.inf         # a single finite rank
    outs[1:, 3] = math.nan
    results = merge_all(impl, outs, lses, return_lse=True, base_e=impl.envelope.base_e)
    for r, (out, lse) in enumerate(results):
        out, lse = out.cpu(), lse.cpu()
        assert not torch.isnan(out).any(), "NaN leaked through a zero weight"
        assert torch.all(out[2] == 0), "a row of empty states did not merge to 0"
        assert torch.equal(out[3], outs[0, 3, heads_of(r, n, h)].cpu()), \
            "a single finite rank's partial did not come back exactly"
        rows = [0, 1, 3]
        merge_check(out[rows], lse[rows], outs[:, rows].cpu(), lses[:, rows].cpu(),
                    heads=heads_of(r, n, h), is_lse_base_on_e=impl.envelope.base_e)


@pytest.mark.convention
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_and_inf_lses_are_empty_states(impl, device, merge_check, dtype):
    """The contract's convention: NaN and +inf LSEs count as -inf (their rank weighs nothing,
    NaN partial included), and a row of empty states returns LSE -inf."""
    n, b, h, d = 4, 3, 4, impl.envelope.fit_head_dim(9)
    outs, lses = partials(n, b, h, d, dtype, seed=4, device=device)
    outs, lses = outs.clone(), lses.clone()
    lses[1, 0] = math.nan
    outs[1, 0] = math.nan
    lses[2, 1] = math.inf
    outs[2, 1] = math.inf
    lses[:, 2] = -math.inf
    outs[:, 2] = 0.0
    results = merge_all(impl, outs, lses, return_lse=True, base_e=impl.envelope.base_e)
    for r, (out, lse) in enumerate(results):
        out, lse = out.cpu(), lse.cpu()
        assert torch.all(lse[2] == -math.inf), f"a row of empty states returned LSE {lse[2]}"
        merge_check(out[:2], lse[:2], outs[:, :2].cpu(), lses[:, :2].cpu(),
                    heads=heads_of(r, n, h), is_lse_base_on_e=impl.envelope.base_e)


@pytest.mark.clause("masking")  # overrides the module's clause
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_shard_rows_with_nan_partials(impl, device, merge_check, dtype):
    """A rank with no local KV for some requests produces garbage (NaN) partials there; with
    seq_lens/query_start_loc the pack kernel masks them and they never reach the output."""
    n, b, h, d = 3, 6, 3, impl.envelope.fit_head_dim(10)
    outs, lses = partials(n, b, h, d, dtype, seed=11, device=device)
    outs, lses = outs.clone(), lses.clone()
    qsl = torch.tensor([0, 2, 4, 5], dtype=torch.int32, device=device)  # row 5 is padding
    seq_lens = [torch.tensor([4, 4, 4], dtype=torch.int32, device=device) for _ in range(n)]
    seq_lens[1] = torch.tensor([4, 0, 4], dtype=torch.int32, device=device)
    outs[1, 2:4] = math.nan          # rank 1 has no KV for request 1 (rows 2, 3)
    lses[1, 2:4] = 1e30              # and a garbage LSE that would dominate if unmasked
    results = merge_all(impl, outs, lses, return_lse=True, base_e=impl.envelope.base_e,
                        seq_lens=seq_lens, query_start_loc=qsl)
    expected_lses = lses.clone()
    expected_lses[1, 2:4] = -math.inf
    expected_lses[:, 5] = -math.inf
    for r, (out, lse) in enumerate(results):
        out, lse = out.cpu(), lse.cpu()
        assert torch.all(out[5] == 0) and torch.all(lse[5] == -math.inf)
        merge_check(out, lse, outs.cpu(), expected_lses.cpu(), heads=heads_of(r, n, h),
                    is_lse_base_on_e=impl.envelope.base_e)


def test_zero_rows_returns_empty(impl, device):
    """B = 0 (a decode step with no tokens on this rank): empty results of the right shapes."""
    outs = torch.empty((2, 0, 4, 8), dtype=torch.float16, device=device)
    lses = torch.empty((2, 0, 4), dtype=torch.float32, device=device)
    out, lse = merge_all(impl, outs, lses, return_lse=True, base_e=impl.envelope.base_e,
                         ranks={0})[0]
    assert out.shape == (0, 2, 8) and lse.shape == (0, 2) and lse.dtype == torch.float32
