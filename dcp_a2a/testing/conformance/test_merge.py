"""Conformance: the merge (unpack_combine, or merge where there is no wire; lse_reduce on a group
of one) against the float64 oracle.

Receive buffers are assembled from the wire-format spec (_spec.py), so the
merge is judged on its own, whatever the implementation's pack does; an implementation that
exposes only ``merge`` is handed the partials of a rank's heads. Errors are judged against
the derived bound of tolerances.yaml through the ``merge_check`` fixture; LSEs are drawn in
float32 with realistic spreads, so precision lost anywhere in the LSE path shows.
"""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.testing.data import (DTYPES, assert_unmodified, heads_of, large_batch,
                                  partials, snapshot)
from dcp_a2a.testing.conformance._refusals import (NOT_DIVISIBLE_WORDS, TripwireGroup,
                                                   dtype_words, refused)
from dcp_a2a.testing.conformance._spec import build_recv, pack_dim, raw_bits
from dcp_a2a.testing.exchange import merge_heads
from dcp_a2a.testing.verdicts import Defect

pytestmark = [pytest.mark.conformance, pytest.mark.clause("merge bound")]


class _OneRank:
    """A DCP group of one, as an engine's own coordinator object (not dcp_a2a.Group). Its
    device_group is None: a group of one must never touch a process group."""

    world_size = 1
    rank_in_group = 0
    device_group = None


def _merge(impl, outs, lses, rank, *, return_lse=True, base_e=None):
    """``rank``'s merge of the partials ``outs[N, B, H, D]``, ``lses[N, B, H]``: the spec's
    receive buffer through the implementation's unpack_combine, or its merge of the rank's heads
    where it has no unpack_combine. (The receive buffer of any rank exercises the same merge;
    the Triton interpreter makes every extra call count.) ``base_e`` None: the envelope's."""
    base_e = impl.envelope.base_e if base_e is None else base_e
    if not (impl.has("unpack_combine") and impl.has("lse_pack_dim")):
        return merge_heads(impl, outs, lses, rank, return_lse=return_lse, base_e=base_e)
    d = outs.shape[-1]
    return impl.unpack_combine(build_recv(outs, lses, rank), d, impl.lse_pack_dim(outs.dtype),
                               return_lse, base_e)


@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_within_bound_at_volume(impl, device, merge_check, dtype, base_e):
    """Every element within the derived per-element bound (2048 elements a case: enough that
    a truncating cast, 16-bit weights or a rounded LSE cannot hide), the returned LSE float32
    and within its own bound."""
    impl.envelope.require(base_e=base_e)
    n, b, h, d = 4, 4, 32, 64
    outs, lses = partials(n, b, h, d, dtype, seed=101 + int(base_e), device=device)
    r = 2
    out, lse = _merge(impl, outs, lses, r, base_e=base_e)
    assert out.dtype == dtype and tuple(out.shape) == (b, h // n, d)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (b, h // n)
    merge_check(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), is_lse_base_on_e=base_e,
                heads=heads_of(r, n, h))


@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_huge_lse_spreads_do_not_overflow(impl, device, merge_check, dtype, base_e):
    """LSEs far outside exp's range (|s| up to 1e4, spreads of thousands) merge without
    inf/NaN: the weights must be formed relative to the row max."""
    impl.envelope.require(base_e=base_e)
    n, b, h, d = 4, 4, 4, 8
    outs, _ = partials(n, b, h, d, dtype, seed=3, device=device)
    lses = torch.tensor([[1e4, 95.0, -1e4, 300.0],
                         [1e4 - 0.5, 90.0, -1e4 + 3.0, -300.0],
                         [-5e3, 100.0, -1e4 + 1.0, 250.0],
                         [1e4 - 2.0, 99.0, -2e4, 310.0]], dtype=torch.float32)
    lses = lses[:, :, None].expand(n, b, h).contiguous().to(device)
    out, lse = _merge(impl, outs, lses, 1, base_e=base_e)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    merge_check(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), is_lse_base_on_e=base_e,
                heads=heads_of(1, n, h))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_weight_never_lets_nan_in(impl, device, merge_check, dtype):
    """A merge with LSE -inf is the identity, even when the partial is NaN or inf; a row with
    every rank at -inf gives 0 (never NaN: the all-empty state)."""
    n, b, h, d = 3, 4, 6, impl.envelope.fit_head_dim(6)
    outs, lses = partials(n, b, h, d, dtype, seed=17, device=device)
    outs, lses = outs.clone(), lses.clone()
    lses[0, 0], outs[0, 0] = -math.inf, math.nan
    lses[1, 1], outs[1, 1] = -math.inf, math.inf
    lses[:, 3], outs[:, 3] = -math.inf, math.nan
    out, lse = (t.cpu() for t in _merge(impl, outs, lses, 1))
    assert not torch.isnan(out).any(), (
        f"NaN leaked through a zero weight at rows {sorted(set(torch.isnan(out).nonzero()[:, 0].tolist()))}")
    assert torch.all(out[3] == 0), f"a row of empty states merged to {out[3].flatten()[:4]}"
    merge_check(out[:3], lse[:3], outs[:, :3].cpu(), lses[:, :3].cpu(),
                is_lse_base_on_e=impl.envelope.base_e, heads=heads_of(1, n, h))


@pytest.mark.convention
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_and_inf_lses_count_as_minus_inf(impl, device, merge_check, dtype):
    """The contract's convention: an LSE of NaN or +inf counts as -inf (its rank weighs 0, even
    with a NaN partial), and a row where every rank is -inf returns LSE -inf."""
    n, b, h, d = 3, 4, 6, impl.envelope.fit_head_dim(6)
    outs, lses = partials(n, b, h, d, dtype, seed=19, device=device)
    outs, lses = outs.clone(), lses.clone()
    lses[1, 1], outs[1, 1] = math.nan, math.inf
    lses[2, 2], outs[2, 2] = math.inf, math.nan
    lses[:, 3], outs[:, 3] = -math.inf, 0.0
    out, lse = (t.cpu() for t in _merge(impl, outs, lses, 1))
    assert not torch.isnan(out[:3]).any(), "a NaN/+inf LSE let its rank's partial in"
    assert torch.all(lse[3] == -math.inf), f"a row of empty states returned LSE {lse[3].tolist()}"
    merge_check(out[:3], lse[:3], outs[:, :3].cpu(), lses[:, :3].cpu(),
                is_lse_base_on_e=impl.envelope.base_e, heads=heads_of(1, n, h))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_nan_partial_of_positive_weight_is_not_hidden(impl, device, dtype):
    """Weight 0 is the only identity: a NaN in a partial whose weight is positive (row 1 has
    equal LSEs on both ranks, so each weighs 1/2) is a fault of that rank's attention, and the
    merged elements it feeds are NaN -- not a plausible value computed without that rank, which
    no later check could tell from a right one. Every other element, and the LSE, stay
    finite."""
    n, b, h, d = 2, 3, 4, impl.envelope.fit_head_dim(10)
    outs, lses = partials(n, b, h, d, dtype, seed=13, device=device)
    outs, lses = outs.clone(), lses.clone()
    lses[:, 1] = lses[0, 1]
    outs[1, 1, :, 3] = math.nan
    expected = torch.zeros((b, h // n, d), dtype=torch.bool)
    expected[1, :, 3] = True
    for r in range(n):
        out, lse = (t.cpu() for t in _merge(impl, outs, lses, r))
        got = torch.isnan(out)
        assert torch.equal(got, expected), (
            f"rank {r}: NaN where the merge must give NaN (row 1, lane 3, weight 1/{n}) and "
            f"nowhere else; got NaN at {got.nonzero().tolist()}")
        assert torch.isfinite(lse).all(), f"rank {r}: a NaN output changed the LSE"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_every_row_of_a_large_batch_is_merged(impl, device, merge_check, dtype):
    """A batch past any row cap (``testing.data.large_batch``): every row within the bound (rows
    past a cap come back unwritten or wrong)."""
    n, b, h, d = 2, large_batch(device), 2, 8
    outs, lses = partials(n, b, h, d, dtype, seed=17, device=device)
    out, lse = _merge(impl, outs, lses, 1)
    assert tuple(out.shape) == (b, h // n, d), tuple(out.shape)
    merge_check(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), heads=heads_of(1, n, h),
                is_lse_base_on_e=impl.envelope.base_e)


def test_repeatable_and_batch_invariant(impl, device):
    """The same inputs give the same bits, call after call, and a row's result does not depend
    on the batch around it (float32, 8 ranks: any change of summation order shows)."""
    n, b, h, d = 8, 4, 16, 32
    outs, lses = partials(n, b, h, d, torch.float32, seed=23, spread=2.0, device=device)
    first = _merge(impl, outs, lses, 1)
    for _ in range(2):
        again = _merge(impl, outs.clone(), lses.clone(), 1)
        for a, e in zip(again, first):
            assert torch.equal(a, e), "the merge is not bitwise repeatable"
    for row in (0, b - 1):
        alone = _merge(impl, outs[:, row:row + 1].contiguous(), lses[:, row:row + 1].contiguous(),
                       1)
        assert torch.equal(alone[0][0], first[0][row]), f"row {row} depends on its batch"
        assert torch.equal(alone[1][0], first[1][row])


@pytest.mark.clause("exchange")  # overrides the module's clause
@pytest.mark.convention
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_group_of_one_is_a_pass_through(impl, device, dtype):
    """lse_reduce on a group of one returns the partial itself, bit for bit, and its LSE as
    float32 (base e or 2 alike), without a process group (what a group of one returns is a
    convention); the inputs are left untouched (that is not)."""
    impl.envelope.require(world_size=1)
    b, h, d = 3, 4, impl.envelope.fit_head_dim(20)
    outs, lses = partials(1, b, h, d, dtype, seed=41, device=device)
    out, lse = outs[0], lses[0]
    before = raw_bits(out).copy()
    for base_e in [b_ == "e" for b_ in impl.envelope.bases]:
        got, got_lse = impl.lse_reduce(out, lse, _OneRank(), return_lse=True,
                                       is_lse_base_on_e=base_e)
        assert got.dtype == dtype and tuple(got.shape) == (b, h, d)
        assert (raw_bits(got) == raw_bits(out)).all(), "group of one changed the output"
        assert got_lse.dtype == torch.float32 and torch.equal(got_lse, lse)
    only = impl.lse_reduce(out, lse, _OneRank())
    assert isinstance(only, torch.Tensor) and (raw_bits(only) == raw_bits(out)).all()
    if not (raw_bits(out) == before).all():
        raise Defect("lse_reduce modified its input")


@pytest.mark.clause("exchange")  # overrides the module's clause
@pytest.mark.convention
@pytest.mark.parametrize("lse_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_group_of_one_widens_a_16bit_lse(impl, device, lse_dtype):
    """An LSE handed over in bf16/fp16 comes back as float32 (widened by value: exact), as it
    does from a group of N: the dtype of the result never depends on the group's size."""
    impl.envelope.require(world_size=1, lse_dtype=lse_dtype)
    outs, lses = partials(1, 3, 4, 8, torch.bfloat16, seed=45, device=device)
    lse16 = lses[0].to(lse_dtype)
    got, got_lse = impl.lse_reduce(outs[0], lse16, _OneRank(), return_lse=True)
    assert (raw_bits(got) == raw_bits(outs[0])).all(), "group of one changed the output"
    assert got_lse.dtype == torch.float32, f"returned LSE is {got_lse.dtype}, not float32"
    assert torch.equal(got_lse, lse16.to(torch.float32))


@pytest.mark.clause("masking")  # overrides the module's clause
@pytest.mark.surface("masking", "exchange")
@pytest.mark.convention
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_group_of_one_masks_empty_and_padding_rows(impl, device, dtype):
    """Rows whose request has no local KV and padding rows merge to 0 with LSE -inf even on a
    group of one, whatever garbage the partial holds there (a group of one's convention)."""
    impl.envelope.require(world_size=1)
    b, h, d = 6, 2, impl.envelope.fit_head_dim(12)
    outs, lses = partials(1, b, h, d, dtype, seed=43, device=device)
    out, lse = outs[0].clone(), lses[0].clone()
    qsl = torch.tensor([0, 1, 3, 4], dtype=torch.int64, device=device)  # rows 4, 5: padding
    seq_lens = torch.tensor([5, 0, 9], dtype=torch.int64, device=device)  # rows 1, 2: no KV
    out[1:3], lse[1:3] = math.nan, 1e30
    out[4:], lse[4:] = math.nan, 50.0
    before = snapshot(out=out, lse=lse, seq_lens=seq_lens, query_start_loc=qsl)
    got, got_lse = impl.lse_reduce(out, lse, _OneRank(), return_lse=True, seq_lens=seq_lens,
                                   query_start_loc=qsl)
    assert_unmodified(before, "lse_reduce")
    for row in (1, 2, 4, 5):
        assert torch.all(got[row] == 0), f"masked row {row} produced {got[row].flatten()[:4]}"
        assert torch.all(got_lse[row] == -math.inf)
    for row in (0, 3):
        assert (raw_bits(got[row]) == raw_bits(out[row])).all()
        assert torch.equal(got_lse[row], lse[row])


def _float8_dtypes():
    return [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                        "float8_e5m2fnuz") if hasattr(torch, n)]


@pytest.mark.clause("bad input")  # overrides the module's clause
@pytest.mark.surface("exchange")
@pytest.mark.parametrize("dtype", _float8_dtypes() + [torch.float64], ids=str)
def test_unsupported_output_dtypes_rejected_by_lse_reduce(impl, device, dtype):
    """No wire format exists for float8 (cannot carry the float32 LSE bits) or float64:
    lse_reduce says so with a ValueError (or TypeError) naming the dtype before any collective
    (a process group whose collectives fail the test), instead of a silent layout."""

    class Group:
        world_size, rank_in_group, device_group = 2, 0, TripwireGroup(2)

    outs, lses = partials(1, 2, 2, 8, torch.float32, seed=1, device=device)
    with refused(dtype_words(dtype), dtype_problem=True):
        impl.lse_reduce(outs[0].to(dtype), lses[0], Group())


@pytest.mark.clause("bad input")  # overrides the module's clause
@pytest.mark.parametrize("entry", [pytest.param("lse_reduce", marks=pytest.mark.surface("exchange")),
                                   pytest.param("pack_send", marks=pytest.mark.surface("wire"))])
@pytest.mark.parametrize("h,n", [(6, 4), (5, 2)])
def test_heads_not_divisible_is_a_value_error(impl, device, h, n, entry):
    """H % N != 0 is refused before any collective (a process group whose collectives fail
    the test), never silently truncated."""

    class Group:
        world_size, rank_in_group, device_group = n, 0, TripwireGroup(n)

    outs, lses = partials(1, 2, h, 8, torch.float16, seed=2, device=device)
    if entry == "lse_reduce":
        with refused(NOT_DIVISIBLE_WORDS):
            impl.lse_reduce(outs[0], lses[0], Group())
        return
    send = torch.empty((n, 2, h // n, 10), dtype=torch.float16, device=device)
    with refused(NOT_DIVISIBLE_WORDS):
        impl.pack_send(outs[0], lses[0], send, n, h // n, 8, pack_dim(torch.float16))
