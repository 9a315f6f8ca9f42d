"""Every argument of the public API probed the way a new user's mistakes look (negative, zero,
NaN, inf, empty, duplicate, huge, wrong type): a ValueError/TypeError naming the argument, or a
documented meaning that the result then shows. One test a class of mistake."""

from __future__ import annotations

import math

import pytest
import torch

import dcp_a2a
from dcp_a2a import Group, StagingBuffers, SymmMemBuffers
from dcp_a2a.testing.data import partials
from dcp_a2a.testing.mirror import MirrorGroup

pytestmark = pytest.mark.unit

# where the kernels run: CUDA on a GPU machine (whose checks refuse CPU tensors: the interpreter
# is off there), else the CPU
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
OUTS, LSES = partials(2, 2, 4, 8, torch.float16, device=DEV)


@pytest.fixture(autouse=True)
def _tensors_on_the_kernels_device():
    """The calls below make their tensors where the kernels run."""
    torch.set_default_device(DEV)
    yield
    torch.set_default_device(None)


def _pack(**change):
    a = dict(out=OUTS[0], lse=LSES[0], send=torch.empty(2, 2, 2, 10, dtype=torch.float16),
             world_size=2, h_per_rank=2, head_dim=8, lse_pack_dim=2)
    a.update(change)
    return lambda: dcp_a2a.pack_send(**a)


def _unpack(*args, **kw):
    recv = torch.zeros(2, 2, 2, 10, dtype=torch.float16)
    full = dict(zip(("head_dim", "lse_pack_dim", "return_lse", "is_lse_base_on_e"),
                    (8, 2, False, True)))
    full.update(kw)
    return lambda: dcp_a2a.unpack_combine(args[0] if args else recv, **full)


def _reduce(group=None, **kw):
    return lambda: dcp_a2a.lse_reduce(OUTS[0], LSES[0], group or Group(1, 0, None), **kw)


NAN, INF = float("nan"), float("inf")
REFUSED = {  # case: (call, exception type, words the message must hold)
    # wrong type
    "lse_pack_dim(str)": (lambda: dcp_a2a.lse_pack_dim("float16"), TypeError, "torch.dtype"),
    "pack world_size=NaN": (_pack(world_size=NAN), TypeError, "world_size"),
    "pack world_size=inf": (_pack(world_size=INF), TypeError, "world_size"),
    "pack head_dim=NaN": (_pack(head_dim=NAN), TypeError, "head_dim"),
    "pack lse_pack_dim='2'": (_pack(lse_pack_dim="2"), TypeError, "lse_pack_dim must be an int"),
    "pack seq_lens list": (lambda: dcp_a2a.pack_send(**{**dict(
        out=OUTS[0], lse=LSES[0], send=torch.empty(2, 2, 2, 10, dtype=torch.float16),
        world_size=2, h_per_rank=2, head_dim=8, lse_pack_dim=2)}, seq_lens=[1, 1],
        query_start_loc=[0, 1, 2]), TypeError, "seq_lens"),
    "unpack lse_pack_dim=None": (_unpack(lse_pack_dim=None), TypeError, "lse_pack_dim"),
    "unpack return_lse=None": (_unpack(return_lse=None), TypeError, "return_lse"),
    "unpack into str": (_unpack(into="out"), TypeError, "into"),
    "reduce group=None": (_reduce(group=object()), TypeError, "world_size"),
    "reduce world_size=NaN": (_reduce(Group(NAN, 0, None)), TypeError, "world_size"),
    "reduce rank str": (_reduce(Group(2, "0", MirrorGroup(2, 0))), TypeError, "rank_in_group"),
    "reduce check_ranks=1": (_reduce(check_ranks=1), TypeError, "check_ranks"),
    "reduce buffers str": (_reduce(buffers="x"), TypeError, "buffers"),
    "reduce w_uv list": (_reduce(w_uv=[[1.0]]), TypeError, "w_uv"),
    "from_process_group(int)": (lambda: Group.from_process_group(5), TypeError,
                                "ProcessGroup"),
    "from_process_group(str)": (lambda: Group.from_process_group("world"), TypeError,
                                "ProcessGroup"),
    "staging dtype str": (lambda: StagingBuffers().get((2,), "float16", "cpu", "x"), TypeError,
                          "dtype"),
    "staging tag int": (lambda: StagingBuffers().get((2,), torch.float16, "cpu", 5), TypeError,
                        "tag"),
    "symm_mem dtype str": (lambda: SymmMemBuffers(Group(1, 0, None), max_tokens=1, num_heads=4,
                                                  head_dim=8, dtype="float16"), TypeError,
                           "dtype"),
    # negative and zero
    "pack world_size=0": (_pack(world_size=0), ValueError, "world_size"),
    "pack h_per_rank=-1": (_pack(h_per_rank=-1), ValueError, "h_per_rank"),
    "pack head_dim=0": (_pack(head_dim=0), ValueError, "head_dim"),
    "unpack head_dim=-1": (_unpack(head_dim=-1), ValueError, "head_dim"),
    "unpack no peers": (_unpack(torch.zeros(0, 2, 2, 10, dtype=torch.float16)), ValueError,
                        "peer"),
    "reduce world_size=0": (_reduce(Group(0, 0, None)), ValueError, "world_size"),
    "reduce rank=-1": (_reduce(Group(2, -1, MirrorGroup(2, 0))), ValueError, "rank_in_group"),
    "reduce w_uv V=0": (_reduce(w_uv=torch.zeros(4, 8, 0, dtype=torch.float16)), ValueError,
                        "V=0"),
    "staging shape -1": (lambda: StagingBuffers().get((-1, 2), torch.float16, "cpu", "x"),
                         ValueError, ">= 0"),
    "staging pair shape -1": (lambda: StagingBuffers().wire_pair((2, -1), torch.float16, "cpu"),
                              ValueError, ">= 0"),
    "symm_mem max_tokens=0": (lambda: SymmMemBuffers(Group(1, 0, None), max_tokens=0,
                                                     num_heads=4, head_dim=8,
                                                     dtype=torch.float16), ValueError,
                              "max_tokens"),
    # huge
    "pack world_size=2^62": (_pack(world_size=2 ** 62), ValueError, "divisible"),
    "unpack head_dim=2^62": (_unpack(head_dim=2 ** 62), ValueError, "head_dim"),
    # unknown values
    "reduce backend None": (_reduce(backend=None), ValueError, "backend"),
    "reduce up_proj 'first'": (_reduce(up_proj="first"), ValueError, "up_proj"),
    "reduce up_proj without w_uv": (_reduce(up_proj="after_merge"), ValueError, "w_uv"),
    "staging device 'gpu7'": (lambda: StagingBuffers().get((2,), torch.float16, "gpu7", "x"),
                              ValueError, "gpu7"),
    "symm_mem device 'gpu7'": (lambda: SymmMemBuffers(Group(1, 0, None), max_tokens=1,
                                                      num_heads=4, head_dim=8,
                                                      dtype=torch.float16, device="gpu7"),
                               ValueError, "gpu7"),
    "device_group a str": (_reduce(Group(2, 0, "pg")), ValueError, "ProcessGroup"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_naming_the_argument(case):
    call, kind, words = REFUSED[case]
    with pytest.raises(kind, match=words):
        call()


def test_the_same_memory_in_two_roles_is_refused():
    """send carved from out's own storage (the duplicate that matters: a kernel writing what
    it reads); into the partial itself."""
    flat = torch.zeros(2 * 4 * 8 + 2 * 2 * 2 * 10, dtype=torch.float16)
    out = flat[:64].view(2, 4, 8)
    with pytest.raises(ValueError, match="overlaps out"):
        dcp_a2a.pack_send(out, LSES[0], flat[32:32 + 80].view(2, 2, 2, 10), 2, 2, 8, 2)
    out = OUTS[0].clone()
    with pytest.raises(ValueError, match="into overlaps out"):
        dcp_a2a.lse_reduce(out, LSES[0], Group(2, 0, MirrorGroup(2, 0)), into=out[:, :2])


def test_documented_meanings():
    """What is accepted, and means what the README says: B = 0 and H = 0 are empty results
    without a launch; NaN / +inf LSEs count as -inf (a row of them merges to 0, -inf); a NaN
    partial of weight 0 contributes nothing; a huge seq_len is a long local KV (any value
    > 0); W_UV is used as given (a NaN in it reaches the result, as arithmetic does)."""
    empty = torch.empty(2, 0, 2, 10, dtype=torch.float16)
    dcp_a2a.pack_send(OUTS[0][:0], LSES[0][:0], empty, 2, 2, 8, 2)
    assert dcp_a2a.unpack_combine(empty, 8, 2, False, True).shape == (0, 2, 8)
    dcp_a2a.pack_send(OUTS[0][:, :0], LSES[0][:, :0], torch.empty(2, 2, 0, 10,
                                                                  dtype=torch.float16),
                      2, 0, 8, 2)
    one = Group(1, 0, None)
    out, lse = dcp_a2a.lse_reduce(torch.full_like(OUTS[0], NAN),
                                  torch.full_like(LSES[0], NAN), one, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)
    out, lse = dcp_a2a.lse_reduce(OUTS[0], torch.full_like(LSES[0], INF), one,
                                  return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)
    send = torch.empty(2, 2, 2, 10, dtype=torch.float16)
    dcp_a2a.pack_send(OUTS[0], LSES[0], send, 2, 2, 8, 2, seq_lens=torch.tensor([2 ** 40, 1]),
                      query_start_loc=torch.tensor([0, 1, 2]))
    lanes = send[..., 8:].contiguous().view(torch.float32)[..., 0]
    assert torch.isfinite(lanes).all()  # nothing masked
    w = torch.zeros(4, 8, 3, dtype=torch.float16)
    w[0, 0, 0] = NAN
    y = dcp_a2a.lse_reduce(OUTS[0], LSES[0], one, w_uv=w)
    assert torch.isnan(y[:, 0, 0]).all() and not torch.isnan(y[:, 1:]).any()


def test_group_is_a_record_checked_where_it_is_used():
    """Group holds what it is given; lse_reduce and SymmMemBuffers refuse a bad one, naming the
    field, before any kernel or collective."""
    bad = Group(-1, 0, None)
    for use in (lambda: dcp_a2a.lse_reduce(OUTS[0], LSES[0], bad),
                lambda: SymmMemBuffers(bad, max_tokens=1, num_heads=4, head_dim=8,
                                       dtype=torch.float16)):
        with pytest.raises(ValueError, match="world_size must be >= 1"):
            use()
