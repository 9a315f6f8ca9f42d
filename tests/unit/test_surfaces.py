"""What an implementation exposes of the contract and its envelope (dcp_a2a.testing.surfaces):
read off its functions and their parameters, or declared; envelopes validated and fitted."""

from __future__ import annotations

import types

import pytest
import torch

from dcp_a2a.testing.surfaces import FULL, Envelope, envelope_of, exposed

pytestmark = pytest.mark.unit


def _ns(**fns):
    return types.SimpleNamespace(**fns)


def lse_pack_dim(dtype):
    return 2


def pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim, seq_lens=None,
              query_start_loc=None):
    pass


def pack_send_plain(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim):
    pass


def unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e, into=None):
    pass


def lse_reduce(out, lse, group, *, return_lse=False, is_lse_base_on_e=True, w_uv=None):
    pass


def merge(outs, lses, is_lse_base_on_e=True, return_lse=False):
    pass


@pytest.mark.parametrize("obj,want", [
    (_ns(merge=merge), {"merge"}),
    (_ns(lse_pack_dim=lse_pack_dim, pack_send=pack_send_plain), {"wire"}),
    (_ns(lse_pack_dim=lse_pack_dim, pack_send=pack_send), {"wire", "masking"}),
    (_ns(lse_pack_dim=lse_pack_dim, unpack_combine=unpack_combine),
     {"merge", "caller buffer"}),
    (_ns(lse_reduce=lse_reduce), {"exchange", "up-projection"}),
    (_ns(lse_pack_dim=lse_pack_dim), set()),
], ids=["merge_only", "wire", "wire_masks", "combine_into", "reduce_w_uv", "pack_dim_only"])
def test_surfaces_are_read_off_functions_and_parameters(obj, want):
    assert exposed(obj) == want


def test_declared_surfaces_win_and_are_checked():
    assert exposed(_ns(merge=merge, SURFACES=("merge", "wire"))) == {"merge", "wire"}
    with pytest.raises(ValueError, match="'wires'"):
        exposed(_ns(merge=merge, SURFACES=("wires",)))


def test_the_project_exposes_its_surfaces():
    import dcp_a2a

    assert {"merge", "wire", "masking", "exchange"} <= exposed(dcp_a2a)


@pytest.mark.parametrize("kind,d,fit", [("power of two", 24, 32), ("power of two", 3, 4),
                                        ("power of two", 64, 64), ("even", 3, 4),
                                        ("even", 80, 80), ("any", 3, 3)])
def test_head_dims_fit_the_envelope(kind, d, fit):
    env = Envelope(head_dims=kind)
    assert env.fit_head_dim(d) == fit and env.head_dim_ok(fit)


def test_outside_names_the_limit_and_require_skips():
    env = Envelope(head_dims="power of two", world_sizes="at least 2", lse_dtypes=("float32",),
                   bases=("2",))
    assert "head dim 24" in env.outside(head_dim=24)
    assert "group of 1" in env.outside(world_size=1)
    assert "bfloat16 LSE" in env.outside(lse_dtype=torch.bfloat16)
    assert "base-e" in env.outside(base_e=True)
    assert env.outside(head_dim=32, world_size=2, lse_dtype=torch.float32, base_e=False) is None
    assert not env.base_e
    names = [n for n, _ in env.limits()]
    assert names == ["head_dims", "world_sizes", "lse_dtypes", "lse_dtypes", "bases"]
    with pytest.raises(pytest.skip.Exception, match="outside the envelope: head dim 3"):
        env.require(head_dim=3)
    assert FULL.limits() == [] and FULL.describe() == "the whole contract"


@pytest.mark.parametrize("kw", [dict(head_dims="pow2"), dict(world_sizes=2),
                                dict(lse_dtypes="float32"), dict(bases=()),
                                dict(bases=("10",))])
def test_an_envelope_says_what_is_wrong_with_it(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        Envelope(**kw)


def test_envelope_of_checks_the_declaration():
    assert envelope_of(_ns()) is FULL
    with pytest.raises(ValueError, match="ENVELOPE must be"):
        envelope_of(_ns(ENVELOPE={"head_dims": "even"}))
