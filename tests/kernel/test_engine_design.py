"""The benchmark's engine-design baseline (dcp_a2a.testing.engine_design) merges what ours merges:
within the derived bound of the float64 oracle, head dims that are not powers of two included,
so the timed comparison is between two correct kernels."""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a.inprocess import all_to_all
from dcp_a2a.testing import engine_design
from dcp_a2a.testing.data import heads_of, partials, poison_like

# an all -inf row takes log(0) = -inf and -inf - -inf on purpose (the weight is then selected
# away); the interpreter's numpy warns about both
pytestmark = [pytest.mark.kernel,
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")]

# bf16 on the CPU: the interpreter truncates the baseline's plain fp32 -> bf16 cast (ours rounds
# through integer bits), so there it is checked to within one bf16 ulp of ours instead
CPU_BF16 = not torch.cuda.is_available()


def _wire(device, dtype, n, b, h, d, seed, lse_edits=(), out_edits=()):
    """Every rank's receive buffer after the exchange, from random partials whose LSEs get
    ``lse_edits`` ((rank, token, head, value), ...) and whose outputs get ``out_edits``
    ((rank, token, value): every head and lane of that token) first."""
    outs, lses = partials(n, b, h, d, dtype, seed=seed, device=device)
    for r, t, j, v in lse_edits:
        lses[r, t, j] = v
    for r, t, v in out_edits:
        outs[r, t] = v
    p = dcp_a2a.lse_pack_dim(dtype)
    sends = [poison_like(torch.empty(n, b, h // n, d + p, dtype=dtype, device=device))
             for _ in range(n)]
    for r in range(n):
        dcp_a2a.pack_send(outs[r], lses[r], sends[r], n, h // n, d, p)
    return outs, lses, all_to_all(sends), p


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n, h, d, base_e", [(2, 4, 64, True), (3, 6, 40, True),
                                             (4, 8, 80, True), (4, 8, 80, False)])
def test_engine_design_merges_within_the_bound(device, merge_check, dtype, n, h, d, base_e):
    """D = 64 (a power of two), 40 and 80 (padded to 64 and 128 and masked)."""
    b = 3
    # token 0, head 0: every rank -inf (merges to 0 and -inf); token 1, head 1: one NaN and
    # one +inf LSE (both count as -inf)
    edits = [(r, 0, 0, float("-inf")) for r in range(n)]
    edits += [(0, 1, 1, float("nan")), (n - 1, 1, 1, float("inf"))]
    outs, lses, recvs, p = _wire(device, dtype, n, b, h, d, seed=n + d, lse_edits=edits)
    for r in range(n):
        got = poison_like(torch.empty(b, h // n, d, dtype=dtype, device=device))
        got_lse = poison_like(torch.empty(b, h // n, device=device))
        engine_design.unpack_combine(recvs[r], d, True, base_e, out=got, lse=got_lse)
        assert got.shape == (b, h // n, d) and got.dtype == dtype
        assert got_lse.dtype == torch.float32
        if r == 0:
            assert torch.all(got[0, 0] == 0) and got_lse[0, 0] == float("-inf")
        if dtype == torch.bfloat16 and CPU_BF16:
            ours, ours_lse = dcp_a2a.unpack_combine(recvs[r], d, p, True, base_e)
            torch.testing.assert_close(got.float(), ours.float(), rtol=2 ** -7, atol=1e-30)
            torch.testing.assert_close(got_lse, ours_lse, rtol=1e-6, atol=1e-6)
            continue
        merge_check(got, got_lse, outs, lses, heads=heads_of(r, n, h),
                    is_lse_base_on_e=base_e)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("base_e", [True, False])
def test_engine_design_keeps_nan_partials_of_zero_weight_out(device, merge_check, dtype, base_e):
    """A rank whose LSE is -inf, or so far below the others that its weight underflows to 0,
    may carry NaN partials (an empty shard's garbage): the merge is the oracle's without them.
    The baseline ours is timed against must be a correct kernel too."""
    n, b, h, d = 3, 2, 6, 16
    # token 0: rank 1 empty; token 1: rank 2's weight underflows (2^-10000 and e^-10000)
    edits = [(1, 0, j, float("-inf")) for j in range(h)] + [(2, 1, j, -1e4) for j in range(h)]
    outs, lses, recvs, p = _wire(device, dtype, n, b, h, d, seed=5, lse_edits=edits,
                                 out_edits=[(1, 0, float("nan")), (2, 1, float("nan"))])
    for r in range(n):
        got = poison_like(torch.empty(b, h // n, d, dtype=dtype, device=device))
        got_lse = poison_like(torch.empty(b, h // n, device=device))
        engine_design.unpack_combine(recvs[r], d, True, base_e, out=got, lse=got_lse)
        merge_check(got, got_lse, outs, lses, heads=heads_of(r, n, h), is_lse_base_on_e=base_e)


def test_engine_design_without_lse_returns_the_output_alone(device):
    n, b, h, d = 2, 2, 4, 24
    outs, lses, recvs, p = _wire(device, torch.float32, n, b, h, d, seed=1)
    got = engine_design.unpack_combine(recvs[0], d)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, dcp_a2a.unpack_combine(recvs[0], d, p, False, True),
                               rtol=1e-5, atol=1e-6)
    empty = engine_design.unpack_combine(recvs[0][:, :0], d, True)  # B = 0: no launch
    assert empty[0].shape == (0, h // n, d) and empty[1].shape == (0, h // n)
