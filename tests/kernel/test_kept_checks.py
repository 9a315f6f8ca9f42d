"""The public ops keep a checked problem (dcp_a2a.ops): a kept key never changes a
verdict. Each case is a good call and a bad one that differs from it in one thing; the bad call
must be refused in the same words right after the good one (whose key is then kept) as from a
cold start. A key that left out what a check reads would let the bad call through on the good
call's verdict. And the keeping is real: a kept key skips the checks."""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a import collective, ops
from dcp_a2a.testing.data import bits_view

pytestmark = pytest.mark.kernel

B, N, HPR, D = 3, 2, 2, 8
H = N * HPR
DT = torch.bfloat16
P = 2


def _inputs(dtype=DT, device="cpu"):
    g = torch.Generator().manual_seed(1)
    out = torch.randn((B, H, D), generator=g).to(dtype).to(device)
    lse = torch.randn((B, H), generator=g).to(device)
    send = torch.empty((N, B, HPR, D + dcp_a2a.lse_pack_dim(dtype)), dtype=dtype, device=device)
    return out, lse, send


def _overlapping(device):
    """send carved from the storage that out lies in: same shapes, strides and alignment."""
    flat = torch.zeros(B * H * D + N * B * HPR * (D + P), dtype=DT, device=device)
    out = flat[:B * H * D].view(B, H, D)
    send = flat[B * H * D - 16:B * H * D - 16 + send_numel()].view(N, B, HPR, D + P)
    return out, torch.zeros(B, H, device=device), send


def send_numel():
    return N * B * HPR * (D + P)


def _pack_good(device):
    out, lse, send = _inputs(device=device)
    return (out, lse, send, N, HPR, D, P), {}


def _with(args, **changes):
    names = ("out", "lse", "send", "world_size", "h_per_rank", "head_dim", "lse_pack_dim")
    full = dict(zip(names, args))
    kw = {k: changes.pop(k) for k in ("seq_lens", "query_start_loc") if k in changes}
    full.update(changes)
    return tuple(full[n] for n in names), kw


def _meta_like(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _pack_bad_cases(device):
    (out, lse, send, *_), _ = _pack_good(device)
    args = (out, lse, send, N, HPR, D, P)
    sl = torch.tensor([2, 0, 5], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=device)
    o2, l2, s2 = _overlapping(device)
    return {
        "send overlaps out": _with(args, out=o2, lse=l2, send=s2),
        "lse in float64": _with(args, lse=lse.double()),
        "out a list": _with(args, out=out.cpu().tolist()),
        "world_size a float": _with(args, world_size=2.0),
        "h_per_rank a bool": _with(args, h_per_rank=True),
        "head_dim a float": _with(args, head_dim=float(D)),
        "lse_pack_dim 1": _with(args, lse_pack_dim=1),
        "send transposed, same shape": _with(
            args, send=torch.empty((N, B, D + P, HPR), dtype=DT, device=device)
            .transpose(2, 3)),
        "send in float16": _with(args, send=send.to(torch.float16)),
        "out on meta": _with(args, out=_meta_like(out)),
        "lse on meta": _with(args, lse=_meta_like(lse)),
        "seq_lens without query_start_loc": _with(args, seq_lens=sl),
        "seq_lens in float": _with(args, seq_lens=sl.float(), query_start_loc=qsl),
        "query_start_loc one short": _with(args, seq_lens=sl, query_start_loc=qsl[:-1]),
        "seq_lens on meta": _with(args, seq_lens=_meta_like(sl), query_start_loc=qsl),
    }


def _refusal(fn, *args, **kw):
    """(exception type, message) of fn's refusal, or None when it accepts."""
    try:
        fn(*args, **kw)
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    return None


@pytest.fixture(autouse=True)
def _cold():
    ops.forget_calls()
    yield
    ops.forget_calls()


@pytest.mark.parametrize("case", list(_pack_bad_cases("cpu")))
def test_pack_send_refuses_after_a_kept_good_call(device, case):
    bad_args, bad_kw = _pack_bad_cases(device)[case]
    cold = _refusal(dcp_a2a.pack_send, *bad_args, **bad_kw)
    assert cold is not None, f"{case}: accepted from a cold start (the case is not bad)"
    good_args, good_kw = _pack_good(device)
    if case == "send overlaps out":  # the good twin: same shapes and storage kind, apart
        o, l, s = _overlapping(device)
        good_args = (o.clone(), l, s.clone(), N, HPR, D, P)
    dcp_a2a.pack_send(*good_args, **good_kw)
    dcp_a2a.pack_send(*good_args, **good_kw)  # kept now
    assert ops._PACK_CALLS, "the good call's key was not kept"
    assert _refusal(dcp_a2a.pack_send, *bad_args, **bad_kw) == cold, case


def _unpack_bad_cases(device):
    recv = torch.zeros((N, B, HPR, D + P), dtype=DT, device=device)
    good = (recv, D, P, True, True)
    return {
        "recv transposed, same shape": (torch.zeros((N, HPR, B, D + P), dtype=DT, device=device)
                                        .transpose(1, 2), D, P, True, True),
        "recv on meta": (_meta_like(recv), D, P, True, True),
        "return_lse an int": (recv, D, P, 1, True),
        "is_lse_base_on_e an int": (recv, D, P, True, 0),
        "head_dim a float": (recv, float(D), P, True, True),
        "lse_pack_dim 1": (recv, D, 1, True, True),
        "recv an array": (recv.float().cpu().numpy(), D, P, True, True),
    }, good


@pytest.mark.parametrize("case", list(_unpack_bad_cases("cpu")[0]))
def test_unpack_combine_refuses_after_a_kept_good_call(device, case):
    cases, good = _unpack_bad_cases(device)
    bad = cases[case]
    cold = _refusal(dcp_a2a.unpack_combine, *bad)
    assert cold is not None, f"{case}: accepted from a cold start (the case is not bad)"
    dcp_a2a.unpack_combine(*good)
    dcp_a2a.unpack_combine(*good)
    assert ops._UNPACK_CALLS, "the good call's key was not kept"
    assert _refusal(dcp_a2a.unpack_combine, *bad) == cold, case


def test_a_kept_key_skips_the_checks_and_gives_the_same_bits(device, monkeypatch):
    """The second call of a problem runs none of the first call's checks, and writes what a
    checked call writes; a swapped launch table checks again."""
    args, _ = _pack_good(device)
    out, lse, send = args[:3]
    dcp_a2a.pack_send(*args)
    first = send.clone()
    recv_first = dcp_a2a.unpack_combine(send, D, P, True, False)

    def tripped(*a, **k):
        raise AssertionError("a check ran for a kept key")
    for name in ("check_output_and_lse", "check_wire_buffer", "check_seq_meta"):
        monkeypatch.setattr(ops, name, tripped)
    send.fill_(float("nan"))
    dcp_a2a.pack_send(*args)
    assert torch.equal(send.view(torch.int16), first.view(torch.int16))
    again = dcp_a2a.unpack_combine(send, D, P, True, False)
    assert all(torch.equal(bits_view(a), bits_view(b)) for a, b in zip(again, recv_first))

    from dcp_a2a.kernels import tuning
    monkeypatch.setattr(tuning, "ACTIVE", dict(tuning.ACTIVE))  # the same rules, anew
    with pytest.raises(AssertionError, match="a check ran"):
        dcp_a2a.pack_send(*args)


def test_nothing_is_kept_under_an_override(device, monkeypatch):
    """A launch an override chose (the bench's candidates) is not kept: after the override the
    problem is checked and launched under the table again, not as the candidate."""
    from dcp_a2a.kernels import tuning
    args, _ = _pack_good(device)
    recv = args[2]
    monkeypatch.setitem(tuning.OVERRIDES, "combine", tuning.Launch(1, 8, 2))
    monkeypatch.setitem(tuning.OVERRIDES, "pack", tuning.Launch(1, 8, 2))
    dcp_a2a.pack_send(*args)
    dcp_a2a.unpack_combine(recv, D, P, False, True)
    assert not ops._PACK_CALLS and not ops._UNPACK_CALLS
    monkeypatch.delitem(tuning.OVERRIDES, "combine")
    monkeypatch.delitem(tuning.OVERRIDES, "pack")
    dcp_a2a.pack_send(*args)
    dcp_a2a.unpack_combine(recv, D, P, False, True)
    assert len(ops._PACK_CALLS) == len(ops._UNPACK_CALLS) == 1


@pytest.mark.parametrize("return_lse", [False, True])
def test_a_tensor_subclass_is_merged_unkept(device, return_lse):
    """A tensor subclass (here a Parameter) gets no key: it is checked and merged every call,
    and gives what the plain tensor gives (B = 2, so a result mistaken for a (result, Site)
    pair would unpack along its batch rows)."""
    g = torch.Generator().manual_seed(5)
    recv = torch.randn((N, 2, HPR, D + P), generator=g).to(DT).to(device)
    recv[..., D:] = 0  # LSE bits 0: finite weights
    want = dcp_a2a.unpack_combine(recv, D, P, return_lse, True)
    sub = torch.nn.Parameter(recv.clone(), requires_grad=False)
    for _ in range(2):
        got = dcp_a2a.unpack_combine(sub, D, P, return_lse, True)
        pairs = zip(got, want) if return_lse else [(got, want)]
        assert all(type(a) is torch.Tensor and torch.equal(bits_view(a), bits_view(b))
                   for a, b in pairs)


class _StandInSite:
    """A Site that launches nothing and counts its calls (what ops does with a kept Site)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *addresses):
        self.calls += 1
        return True


def test_a_key_kept_without_a_site_is_bound_when_it_can_be(monkeypatch, device):
    """A key whose first launch could not be bound (a launch hook on, a stand-in under the
    kernel's name: the eager probe's first call) gets its Site at a later call instead of
    staying on the slow path for good (28 us an eager unpack on an H100, not 12.6)."""
    from dcp_a2a.kernels import combine as _combine
    from dcp_a2a.kernels import pack as _pack

    sites, bindable = [], [False]

    def site_if_bindable(with_site):
        if with_site and bindable[0]:
            sites.append(_StandInSite())
            return sites[-1]
        return None

    real_pack, real_combine = _pack.pack, _combine.combine_packed

    def pack(*a, with_site=False, **k):  # launches (the interpreter's), returns the Site
        real_pack(*a, **k)
        return site_if_bindable(with_site)

    def combine_packed(*a, with_site=False, **k):
        res = real_combine(*a, **k)
        return (res, site_if_bindable(with_site)) if with_site else res

    monkeypatch.setattr(_combine, "combine_packed", combine_packed)
    monkeypatch.setattr(_pack, "pack", pack)
    (out, lse, send, *rest), _ = _pack_good(device)
    for _ in range(2):  # kept, with no Site to launch
        dcp_a2a.pack_send(out, lse, send, *rest)
        dcp_a2a.unpack_combine(send, D, P, False, True)
    assert not sites
    bindable[0] = True
    dcp_a2a.pack_send(out, lse, send, *rest)
    dcp_a2a.unpack_combine(send, D, P, False, True)
    assert len(sites) == 2 and [s.calls for s in sites] == [0, 0]
    dcp_a2a.pack_send(out, lse, send, *rest)
    dcp_a2a.unpack_combine(send, D, P, False, True)
    assert len(sites) == 2 and [s.calls for s in sites] == [1, 1]  # the kept Sites launched


# lse_reduce keeps the checks that read no address and no buffer (dcp_a2a.collective._CHECKED)
def _reduce_good(device):
    """A good call that sets every argument the kept checks read (a bad case changes one)."""
    out, lse, _ = _inputs(device=device)
    sl = torch.tensor([2, 0, 5], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=device)
    return (out, lse), {"return_lse": True, "is_lse_base_on_e": False, "seq_lens": sl,
                        "query_start_loc": qsl}


def _reduce_bad_cases(device):
    (out, lse), good = _reduce_good(device)
    sl, qsl = good["seq_lens"], good["query_start_loc"]

    def case(args=(out, lse), **change):
        kw = {**good, **change}
        return args, {k: v for k, v in kw.items() if v is not _DROP}
    return {
        "lse in float64": case((out, lse.double())),
        "out in float64": case((out.double(), lse)),
        "out in float8": case((out.to(torch.float8_e4m3fn), lse)),
        "lse one row short": case((out, lse[:-1])),
        "out without its head dim": case((out[:, :, 0], lse)),
        "out on meta": case((_meta_like(out), lse)),
        "lse on meta": case((out, _meta_like(lse))),
        "return_lse an int": case(return_lse=1),
        "is_lse_base_on_e an int": case(is_lse_base_on_e=0),
        "backend unknown": case(backend="nccl"),
        "backend unhashable": case(backend=["packed"]),
        "backend symm_mem without its buffers": case(backend="symm_mem"),
        "buffers not staging": case(buffers=object()),
        "seq_lens without query_start_loc": case(query_start_loc=_DROP),
        "seq_lens in float": case(seq_lens=sl.float()),
        "seq_lens 2-D": case(seq_lens=sl[None]),
        "query_start_loc one short": case(query_start_loc=qsl[:-1]),
        "query_start_loc in float": case(query_start_loc=qsl.float()),
        "seq_lens on meta": case(seq_lens=_meta_like(sl)),
    }


_DROP = object()  # a bad case leaves this argument out


def _group_of_one():
    return dcp_a2a.Group(1, 0, None)


def _reduce_steps(out, lse, group, **kw):
    """lse_reduce_steps as lse_reduce calls it: it checks when called and launches nothing
    until driven, so a refusal here is its own (the ops' checks behind it do not run)."""
    return collective.lse_reduce_steps(out, lse, group.world_size, group.rank_in_group, **kw)


@pytest.mark.parametrize("entry", [dcp_a2a.lse_reduce, _reduce_steps],
                         ids=["lse_reduce", "lse_reduce_steps"])
@pytest.mark.parametrize("case", list(_reduce_bad_cases("cpu")))
def test_lse_reduce_refuses_after_a_kept_good_call(device, case, entry):
    (args, kw) = _reduce_bad_cases(device)[case]
    cold = _refusal(entry, *args, _group_of_one(), **kw)
    assert cold is not None, f"{case}: accepted from a cold start (the case is not bad)"
    (good, good_kw) = _reduce_good(device)
    dcp_a2a.lse_reduce(*good, _group_of_one(), **good_kw)
    dcp_a2a.lse_reduce(*good, _group_of_one(), **good_kw)  # kept now
    assert collective._CHECKED, "the good call's key was not kept"
    assert _refusal(entry, *args, _group_of_one(), **kw) == cold, case


def test_lse_reduce_refuses_cpu_tensors_without_the_interpreter_after_a_kept_call(monkeypatch):
    """The interpreter switch is part of the key: CPU tensors kept while it was on are refused
    once it is off (the check reads the switch, not the tensors). Through lse_reduce_steps,
    which checks when called and launches nothing until driven."""
    from dcp_a2a import _env
    out, lse, _ = _inputs()
    monkeypatch.setattr(_env, "INTERPRET", True)
    collective.lse_reduce_steps(out, lse, 1, 0)
    collective.lse_reduce_steps(out, lse, 1, 0)
    assert collective._CHECKED, "the call's key was not kept"
    monkeypatch.setattr(_env, "INTERPRET", False)
    with pytest.raises(ValueError, match="CPU tensors need the Triton interpreter"):
        collective.lse_reduce_steps(out, lse, 1, 0)


@pytest.mark.parametrize("return_lse", [False, True])
def test_lse_reduce_kept_key_skips_the_checks_and_gives_the_same_bits(device, monkeypatch,
                                                                      return_lse):
    """lse_reduce's second call of a problem runs none of its checks, and merges what a checked
    call merges; a call with another key checks again."""
    g = torch.Generator().manual_seed(3)
    out = torch.randn((B, H, D), generator=g).to(DT).to(device)
    lse = (torch.randn((B, H), generator=g) * 4).to(device)
    first = dcp_a2a.lse_reduce(out, lse, _group_of_one(), return_lse=return_lse)

    def tripped(*a, **k):
        raise AssertionError("a check ran for a kept key")
    for name in ("check_output_and_lse", "check_head_split", "check_seq_meta"):
        monkeypatch.setattr(collective, name, tripped)
    again = dcp_a2a.lse_reduce(out, lse, _group_of_one(), return_lse=return_lse)
    pairs = zip(again, first) if return_lse else [(again, first)]
    assert all(torch.equal(bits_view(a), bits_view(b)) for a, b in pairs)
    with pytest.raises(AssertionError, match="a check ran"):
        dcp_a2a.lse_reduce(out, lse, _group_of_one(), return_lse=not return_lse)
