"""Metamorphic relations of the merge, checked on the implementation under test directly
(output against output), each within a bound composed from tolerances.yaml (_bounds.py).

identity       a rank with LSE -inf and a NaN partial changes nothing (bitwise when appended)
permutation    reordering the ranks stays within the bound
associativity  merging groups, then the groups' results, equals merging all at once
shift          s_n + c: same output, merged LSE + c
base           a base-2 LSE times ln 2, merged in base-e mode, gives the base-2 result
"""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.testing.data import DTYPES, bits_view, partials
from dcp_a2a.testing.conformance.numerics import _bounds

pytestmark = [pytest.mark.numerics, pytest.mark.conformance, pytest.mark.clause("merge bound")]

ids = str


def _with_identity_rank(outs, lses, at):
    bad_out = torch.full_like(outs[:1], math.nan)
    bad_lse = torch.full_like(lses[:1], -math.inf)
    return (torch.cat([outs[:at], bad_out, outs[at:]]), torch.cat([lses[:at], bad_lse, lses[at:]]))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_identity_rank_changes_nothing(exchange, merge_check, dtype):
    outs, lses = partials(3, 1, 12, 20, dtype, seed=1)  # H = 12: divisible by 3 and 4
    # (the base: the implementation's envelope's, for every merge and oracle of this module)
    base, base_lse = exchange.merge(outs, lses)
    o4, l4 = _with_identity_rank(outs, lses, 3)
    out, lse = exchange.merge(o4, l4)
    assert torch.equal(bits_view(out), bits_view(base)), "appending an identity rank changed bits"
    assert torch.equal(bits_view(lse), bits_view(base_lse))
    # anywhere else in the order: no NaN leaks, within the bound of the same merge
    for at in (0, 1):
        o4, l4 = _with_identity_rank(outs, lses, at)
        out, lse = exchange.merge(o4, l4)
        merge_check(out, lse, o4, l4)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_rank_permutation(exchange, dtype):
    base_e = exchange.impl.envelope.base_e
    outs, lses = partials(4, 2, 8, 24, dtype, seed=2, spread=3.0)
    out, lse = exchange.merge(outs, lses)
    perm = torch.tensor([2, 0, 3, 1])
    pout, plse = exchange.merge(outs[perm], lses[perm])

    def bound_for(form):  # both are within orc's bound of the same oracle
        orc = _bounds.Oracle(outs, lses, base_e, formulation=form)
        return [(_bounds.abs_diff(pout, out), 2 * orc.out_bound),
                (_bounds.abs_diff(plse, lse), 2 * orc.lse_bound)]

    _bounds.judge("rank permutation", bound_for)


@pytest.mark.parametrize("groups", [[[0, 1], [2, 3, 4, 5]], [[4, 1], [3, 0], [5, 2]]], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_hierarchical_merge(exchange, dtype, groups):
    """|hier - flat| <= B_final + sum_G W_G B_G + 2 max_G ε_G sum_G W_G|o_G*| + B_flat, with B
    the output bounds and ε the LSE bounds of the stages (first order in u)."""
    base_e = exchange.impl.envelope.base_e
    outs, lses = partials(6, 1, 12, 32, dtype, seed=3, spread=4.0)
    flat, flat_lse = exchange.merge(outs, lses)
    stages = [exchange.merge(outs[g], lses[g]) for g in groups]
    mid_out = torch.stack([o for o, _ in stages])
    mid_lse = torch.stack([s for _, s in stages])
    hier, hier_lse = exchange.merge(mid_out, mid_lse)

    def bound_for(form):
        stage = [_bounds.Oracle(outs[g], lses[g], base_e, formulation=form) for g in groups]
        final = _bounds.Oracle(mid_out, mid_lse, base_e, formulation=form)
        flat_orc = _bounds.Oracle(outs, lses, base_e, formulation=form)
        w = _bounds.weights(mid_lse, base_e)  # weights of the intermediate results
        eps = torch.stack([o.lse_bound for o in stage]).amax(0)
        exact_mid = torch.stack([o.out for o in stage])
        carried = (w[..., None] * torch.stack([o.out_bound for o in stage])).sum(0)
        moved = 2 * eps[..., None] * (w[..., None] * exact_mid.abs()).sum(0)
        bound = final.out_bound + carried + moved + flat_orc.out_bound
        lse_bound = final.lse_bound + eps + flat_orc.lse_bound
        return [(_bounds.abs_diff(hier, flat), bound),
                (_bounds.abs_diff(hier_lse, flat_lse), lse_bound)]

    _bounds.judge("hierarchical merge", bound_for)


@pytest.mark.parametrize("c", [-1000.0, 37.0, 2048.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_lse_shift(exchange, dtype, c):
    outs, lses = partials(4, 1, 16, 32, dtype, seed=4, spread=4.0)
    # LSEs on a 2^-10 grid below 2^11 in magnitude: s + c is then exact in float32, so the two
    # runs see mathematically shifted inputs and one oracle (up to the shift) covers both
    lses = torch.round(lses * 1024) / 1024
    shifted = lses + c
    assert torch.equal(shifted.double(), lses.double() + c)
    base_e = exchange.impl.envelope.base_e
    out, lse = exchange.merge(outs, lses)
    sout, slse = exchange.merge(outs, shifted)

    def bound_for(form):
        a = _bounds.Oracle(outs, lses, base_e, formulation=form)
        b = _bounds.Oracle(outs, shifted, base_e, formulation=form)
        return [(_bounds.abs_diff(sout, out), a.out_bound + b.out_bound),
                (_bounds.abs_diff(slse.double() - c, lse.double()), a.lse_bound + b.lse_bound)]

    _bounds.judge(f"LSE shift by {c}", bound_for)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_base_2_lse_times_ln2_in_base_e(exchange, dtype):
    """s2 (base 2) and se = fl32(s2 ln 2) differ by the rounding of se (<= u|se|), which moves
    each weight by at most 2u max|se| relatively."""
    outs, lses2 = partials(4, 1, 16, 32, dtype, seed=5, spread=5.0)
    lses_e = (lses2.double() * math.log(2.0)).to(torch.float32)
    out2, lse2 = exchange.merge(outs, lses2, is_lse_base_on_e=False)
    oute, lsee = exchange.merge(outs, lses_e, is_lse_base_on_e=True)
    shift = _bounds.lse_rounding_shift(lses_e)

    def bound_for(form):
        o2 = _bounds.Oracle(outs, lses2, base_e=False, formulation=form)
        oe = _bounds.Oracle(outs, lses_e, formulation=form)
        bound = o2.out_bound + oe.out_bound + 2 * shift[..., None] * oe.mag
        lse_bound = oe.lse_bound + math.log(2.0) * o2.lse_bound + shift
        return [(_bounds.abs_diff(oute, out2), bound),
                (_bounds.abs_diff(lsee.double(), lse2.double() * math.log(2.0)), lse_bound)]

    _bounds.judge("base 2 against base e", bound_for)
