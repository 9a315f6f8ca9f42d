"""Unit tier: the contract's argument handling. Bad input is a ValueError/TypeError that names
the problem, before any kernel launch or collective."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dcp_a2a import Group
from dcp_a2a.testing.conformance._refusals import (DEVICE_WORDS, HEAD_DIM_WORDS,
                                                   NOT_DIVISIBLE_WORDS, PACK_DIM_WORDS,
                                                   STRIDE_WORDS, TripwireGroup, dtype_words,
                                                   refused, refused_instead)
from dcp_a2a.testing.conformance._spec import build_recv, expected_send, raw_bits
from dcp_a2a.testing.data import heads_of, partials, poison_like

pytestmark = [pytest.mark.unit, pytest.mark.conformance, pytest.mark.clause("bad input")]

FLOAT8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                      "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n)]
REJECTED = FLOAT8 + [torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
                     torch.uint8, torch.bool, torch.complex64]


WIRE = pytest.mark.surface("wire")
MASKED_WIRE = pytest.mark.surface("wire", "masking")
EXCHANGE = pytest.mark.surface("exchange")


@WIRE
@pytest.mark.parametrize("dtype,p", [(torch.float16, 2), (torch.bfloat16, 2), (torch.float32, 1)])
def test_lse_pack_dim(impl, dtype, p):
    assert impl.lse_pack_dim(dtype) == p


@WIRE
@pytest.mark.parametrize("dtype", REJECTED, ids=str)
def test_lse_pack_dim_rejects(impl, dtype):
    with refused(dtype_words(dtype), dtype_problem=True):
        impl.lse_pack_dim(dtype)


def _pack_args(n=2, b=2, h=4, d=8, dtype=torch.float16):
    outs, lses = partials(n, b, h, d, dtype)
    p = 2 if dtype != torch.float32 else 1
    send = torch.empty((n, b, h // n, d + p), dtype=dtype)
    return dict(out=outs[0], lse=lses[0], send=send, world_size=n, h_per_rank=h // n,
                head_dim=d, lse_pack_dim=p)


@WIRE
@pytest.mark.parametrize("dtype", FLOAT8 + [torch.float64], ids=str)
def test_pack_rejects_output_dtype(impl, dtype):
    a = _pack_args()
    a["out"] = a["out"].to(dtype)
    with refused(dtype_words(dtype), dtype_problem=True):
        impl.pack_send(**a)


@WIRE
def test_pack_rejects_heads_not_divisible(impl):
    a = _pack_args()
    outs, lses = partials(1, 2, 6, 8, torch.float16)
    a.update(out=outs[0], lse=lses[0], world_size=4, h_per_rank=1,
             send=torch.empty((4, 2, 1, 10), dtype=torch.float16))
    with refused(NOT_DIVISIBLE_WORDS):
        impl.pack_send(**a)


_MASK_CASES = ("seq_lens_device", "seq_lens_alone", "qsl_alone", "qsl_length")


@pytest.mark.parametrize("case", [
    *(pytest.param(c, marks=WIRE) for c in ("lse_shape", "out_4d", "send_shape", "send_rows",
                                            "send_peers", "h_per_rank", "send_dtype",
                                            "head_dim", "pack_dim", "send_device")),
    *(pytest.param(c, marks=MASKED_WIRE) for c in _MASK_CASES)])
def test_pack_rejects_inconsistent(impl, case):
    """Arguments that contradict each other are refused, never resolved by trusting one of them:
    a kernel sized by one and indexing by another truncates, overruns or sends rows it never
    wrote."""
    a = _pack_args()
    if case == "lse_shape":
        a["lse"] = a["lse"][:, :3]
        match = "lse"
    elif case == "out_4d":  # [B, q, H, D] with an lse [B, q] that matches its first dims
        a["out"], a["lse"] = a["out"][:, None], a["lse"][:, :1].contiguous()
        match = r"\bout\b|3-?D|dim|shape"
    elif case == "send_shape":
        a["send"] = torch.empty((2, 2, 2, 9), dtype=torch.float16)
        match = "send"
    elif case == "send_rows":  # room for 3 rows, 2 to pack
        a["send"] = torch.empty((2, 3, 2, 10), dtype=torch.float16)
        match = "send"
    elif case == "send_peers":  # 4 peer slices for a group of 2
        a["send"] = torch.empty((4, 2, 2, 10), dtype=torch.float16)
        match = "send"
    elif case == "h_per_rank":  # H/N = 2
        a["h_per_rank"] = 1
        match = r"h_per_rank|per.rank|H/N|heads"
    elif case == "send_dtype":
        a["send"] = a["send"].to(torch.bfloat16)
        match = "send|dtype"
    elif case == "head_dim":
        a["head_dim"] = 7
        match = HEAD_DIM_WORDS
    elif case == "pack_dim":
        a["lse_pack_dim"] = 1
        match = PACK_DIM_WORDS
    elif case == "send_device":
        a["send"] = torch.empty(a["send"].shape, dtype=a["send"].dtype, device="meta")
        match = DEVICE_WORDS
    elif case == "seq_lens_alone":
        a["seq_lens"] = torch.ones(2, dtype=torch.int32)
        match = "query_start_loc"
    elif case == "seq_lens_device":
        a["seq_lens"] = torch.ones(2, dtype=torch.int32, device="meta")
        a["query_start_loc"] = torch.tensor([0, 1, 2], dtype=torch.int32)
        match = DEVICE_WORDS + "|seq_lens"
    elif case == "qsl_alone":
        a["query_start_loc"] = torch.tensor([0, 1, 2], dtype=torch.int32)
        match = "seq_lens"
    else:  # two requests need three offsets
        a["seq_lens"] = torch.ones(2, dtype=torch.int32)
        a["query_start_loc"] = torch.tensor([0, 1], dtype=torch.int32)
        match = "query_start_loc|seq_lens"
    with refused(match):
        impl.pack_send(**a)


@WIRE
def test_pack_refuses_or_fills_a_strided_send_buffer(impl):
    """The send buffer is the wire buffer of a collective, which sends its memory in order: a
    strided one is refused (an error naming it) or filled through its strides, never written as
    if contiguous from its data pointer."""
    a = _pack_args(dtype=torch.float32)
    big = poison_like(torch.empty(2, 2, 2, 2 * 9, dtype=torch.float32))
    a["send"] = big[..., ::2]  # every other element of a larger buffer
    assert not a["send"].is_contiguous()
    if refused_instead(lambda: impl.pack_send(**a), r"send|contiguous|strides?\b"):
        return
    want = expected_send(a["out"], a["lse"], a["world_size"])
    assert np.array_equal(raw_bits(a["send"]), want), "a strided send buffer was misfilled"


@WIRE
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_unpack_refuses_or_reads_a_strided_recv(impl, device, merge_check, dtype):
    """recv as rows [0, B) of a larger buffer (not contiguous; the rows after hold NaN): refused
    (an error naming recv, contiguity or strides) or read through its strides, never read as
    if its rows were packed from its data pointer."""
    n, b, h, d = 2, 3, 4, impl.envelope.fit_head_dim(12)
    outs, lses = partials(n, b, h, d, dtype, seed=5, device=device)
    recv = build_recv(outs, lses, 0)
    bigger = torch.full((n, b + 2, h // n, recv.shape[-1]), float("nan"), dtype=dtype,
                        device=device)
    bigger[:, :b] = recv
    got = []
    call = lambda: got.append(impl.unpack_combine(  # noqa: E731
        bigger[:, :b], d, impl.lse_pack_dim(dtype), False, True))
    if refused_instead(call, STRIDE_WORDS + r"|recv"):
        return
    merge_check(got[0].cpu(), None, outs.cpu(), lses.cpu(), heads=heads_of(0, n, h))


@MASKED_WIRE
@pytest.mark.parametrize("case", ["float32", "int16", "2d"])
def test_pack_refuses_or_reads_seq_lens_of_another_form(impl, case):
    """seq_lens as float32 or int16 values, or shaped [R, 1]: refused naming seq_lens or its
    dtype/shape, or read by value (the masked rows right), never misread as int32 words."""
    a = _pack_args(b=3, dtype=torch.float32)
    lens = torch.tensor([4, 0, 7])
    a["seq_lens"] = {"float32": lens.float(), "int16": lens.to(torch.int16),
                     "2d": lens.to(torch.int32)[:, None]}[case]
    a["query_start_loc"] = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    a["send"] = poison_like(a["send"])
    words = r"seq_lens|dtype|int32|int64|1-?D|shape|dim"
    if refused_instead(lambda: impl.pack_send(**a), words):
        return
    masked = [False, True, False]
    got = raw_bits(a["send"])
    want = expected_send(a["out"], a["lse"], a["world_size"], empty_rows=masked)
    assert np.array_equal(got[:, :, :, -1], want[:, :, :, -1]), \
        f"seq_lens as {case} accepted but the wrong rows masked"


@WIRE
@pytest.mark.parametrize("lse_dtype", [torch.float64, torch.int32], ids=str)
def test_pack_refuses_or_converts_an_lse_of_another_dtype(impl, lse_dtype):
    """An LSE in a dtype the contract does not list is refused (a ValueError/TypeError naming
    it or the LSE) or converted by value, never read as float32 bits (the class of the bf16 LSE
    reinterpreted as float32)."""
    a = _pack_args(dtype=torch.float32)
    a["lse"] = a["lse"].round().to(lse_dtype)  # values float32 holds exactly
    a["send"] = poison_like(a["send"])
    if refused_instead(lambda: impl.pack_send(**a), dtype_words(lse_dtype) + r"|\blse\b"):
        return
    want = expected_send(a["out"], a["lse"].to(torch.float32), a["world_size"])
    assert np.array_equal(raw_bits(a["send"]), want), \
        f"an LSE in {lse_dtype} was accepted but not converted by value"


@WIRE
@pytest.mark.parametrize("case", ["last_dim", "dtype", "pack_dim", "rank"])
def test_unpack_rejects_bad_recv(impl, case):
    recv = torch.zeros((2, 2, 2, 10), dtype=torch.float16)
    head_dim, p = 8, 2
    if case == "last_dim":
        head_dim = 9
    elif case == "dtype":
        recv = recv.to(torch.float64)
    elif case == "pack_dim":
        p = 1
    else:
        recv = recv[0]
    with refused(dtype_problem=case == "dtype"):
        impl.unpack_combine(recv, head_dim, p, False, True)


@EXCHANGE
def test_lse_reduce_rejects_heads_not_divisible(impl):
    outs, lses = partials(1, 2, 6, 8, torch.float16)
    # the check must come before any collective: a process group that fails the test if used
    with refused(NOT_DIVISIBLE_WORDS):
        impl.lse_reduce(outs[0], lses[0], Group(4, 0, TripwireGroup(4)))


@EXCHANGE
def test_lse_reduce_rejects_fp8(impl):
    if not FLOAT8:
        pytest.skip("this torch has no float8 dtypes")
    outs, lses = partials(1, 2, 4, 8, torch.float16)
    with refused(dtype_words(FLOAT8[0]), dtype_problem=True):
        impl.lse_reduce(outs[0].to(FLOAT8[0]), lses[0], Group(2, 0, TripwireGroup(2)))


@pytest.mark.surface("exchange", "masking")
def test_lse_reduce_rejects_mask_half_given(impl):
    outs, lses = partials(1, 2, 4, 8, torch.float16)
    with refused("query_start_loc"):  # before any collective: a group that fails if used
        impl.lse_reduce(outs[0], lses[0], Group(2, 0, TripwireGroup(2)),
                        seq_lens=torch.ones(2, dtype=torch.int32))
