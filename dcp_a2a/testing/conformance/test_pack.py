"""Kernel tier: the pack kernel writes exactly the reference's wire buffer, bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a import reference
from dcp_a2a.testing.data import (DTYPES, assert_unmodified, bits_view, partials, poison_like,
                                  snapshot)
from dcp_a2a.testing.conformance._refusals import STRIDE_WORDS, refused_instead
from dcp_a2a.testing.exchange import pack_all

pytestmark = [pytest.mark.kernel, pytest.mark.conformance, pytest.mark.clause("wire format")]


def _ref_send(outs_r, lse_r, n, **mask):
    b, h, d = outs_r.shape
    p = reference.lse_pack_dim(outs_r.dtype)
    send = poison_like(torch.empty((n, b, h // n, d + p), dtype=outs_r.dtype))
    reference.pack_send(outs_r.cpu(), lse_r.cpu(), send, n, h // n, d, p, **mask)
    return send


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("d", [1, 7, 80, 96])
def test_send_buffer_bitwise(impl, device, dtype, n, d):
    d = impl.envelope.fit_head_dim(d)
    outs, lses = partials(n, 3, 2 * n, d, dtype, seed=n * 100 + d, device=device)
    sends = pack_all(impl, outs, lses)
    for r in (0, n - 1):
        assert torch.equal(bits_view(sends[r].cpu()), bits_view(_ref_send(outs[r], lses[r], n)))


@pytest.mark.parametrize("lse_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lse_input_dtypes_are_widened_exactly(impl, device, dtype, lse_dtype):
    """A bf16/fp16 LSE is converted to fp32 before packing, never rounded to the output dtype
    and never reinterpreted as fp32 bits."""
    impl.envelope.require(lse_dtype=lse_dtype)
    n, b, h, d = 2, 3, 4, impl.envelope.fit_head_dim(5)
    outs, lses = partials(n, b, h, d, dtype, device=device)
    lse = (lses[0] * 7.3).to(lse_dtype)
    p = impl.lse_pack_dim(dtype)
    send = poison_like(torch.empty((n, b, h // n, d + p), dtype=dtype, device=device))
    impl.pack_send(outs[0], lse, send, n, h // n, d, p)
    lanes = send.cpu().view(torch.int16 if p == 2 else torch.int32)[..., d:].contiguous()
    got = lanes.view(torch.float32).view(n, b, h // n)
    want = lse.cpu().to(torch.float32).view(b, n, h // n).transpose(0, 1)
    assert torch.equal(got.view(torch.int32), want.contiguous().view(torch.int32))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lse_bits_round_trip(impl, device, dtype):
    """Special values keep their exact fp32 bits on the wire: NaN payloads, -0.0, subnormals,
    infinities, the largest finite values."""
    specials = torch.tensor([0x7FC00001, 0x7F800001, 0xFFC12345 - 2**32, 0x80000000 - 2**32,
                             0x00000001, 0x007FFFFF, 0x7F800000, 0xFF800000 - 2**32,
                             0x7F7FFFFF, 0xFF7FFFFF - 2**32, 0x3F800000, 0xC2C80000 - 2**32],
                            dtype=torch.int32)
    n, b = 2, 3
    h = 8
    d = impl.envelope.fit_head_dim(3)
    lse_bits = specials.repeat(b * h // specials.numel() + 1)[: b * h].view(b, h)
    lse = lse_bits.view(torch.float32).to(device)
    outs, _ = partials(n, b, h, d, dtype, device=device)
    p = impl.lse_pack_dim(dtype)
    send = poison_like(torch.empty((n, b, h // n, d + p), dtype=dtype, device=device))
    impl.pack_send(outs[0], lse, send, n, h // n, d, p)
    lanes = send.cpu().view(torch.int16 if p == 2 else torch.int32)[..., d:].contiguous()
    got = lanes.view(torch.int32).view(n, b, h // n)
    want = lse_bits.view(b, n, h // n).transpose(0, 1)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_inputs(impl, device, dtype):
    n, b, h, d = 2, 3, 4, impl.envelope.fit_head_dim(6)
    base_out = torch.randn(d, h, b * 2).to(dtype).to(device)
    out = base_out.permute(2, 1, 0)[::2]          # [b, h, d], no unit stride anywhere
    lse = (torch.randn(h, b * 3) * 4).to(device).t()[::3]  # [b, h], strided
    assert not out.is_contiguous() and not lse.is_contiguous()
    p = impl.lse_pack_dim(dtype)
    send = poison_like(torch.empty((n, b, h // n, d + p), dtype=dtype, device=device))
    if refused_instead(lambda: impl.pack_send(out, lse, send, n, h // n, d, p), STRIDE_WORDS):
        return  # refusing strided input is allowed; reading it as if contiguous is not
    ref = _ref_send(out.contiguous(), lse.contiguous(), n)
    assert torch.equal(bits_view(send.cpu()), bits_view(ref))


def _mask_case(device):
    # 4 requests: [0,2) has KV, [2,3) has none, [3,3) is empty (no rows), [3,5) has KV;
    # rows 5..6 are padding (beyond query_start_loc[-1])
    seq_lens = torch.tensor([5, 0, 3, 2], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 2, 3, 3, 5], dtype=torch.int32, device=device)
    empty_rows = torch.tensor([False, False, True, False, False, True, True])
    return seq_lens, qsl, empty_rows


@pytest.mark.clause("masking")  # overrides the module's clause
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_shard_and_padding_rows_masked(impl, device, dtype, index_dtype):
    seq_lens, qsl, empty_rows = _mask_case(device)
    seq_lens, qsl = seq_lens.to(index_dtype), qsl.to(index_dtype)
    n, b, h, d = 2, 7, 4, impl.envelope.fit_head_dim(5)
    outs, lses = partials(n, b, h, d, dtype, device=device)
    p = impl.lse_pack_dim(dtype)
    send = poison_like(torch.empty((n, b, h // n, d + p), dtype=dtype, device=device))
    before = snapshot(out=outs[0], lse=lses[0], seq_lens=seq_lens, query_start_loc=qsl)
    impl.pack_send(outs[0], lses[0], send, n, h // n, d, p, seq_lens=seq_lens,
                   query_start_loc=qsl)
    assert_unmodified(before, "pack_send")
    lanes = send.cpu().view(torch.int16 if p == 2 else torch.int32)[..., d:].contiguous()
    got = lanes.view(torch.float32).view(n, b, h // n)
    assert torch.all(got[:, empty_rows] == -math.inf)
    want = lses[0].cpu().view(b, n, h // n).transpose(0, 1)[:, ~empty_rows]
    assert torch.equal(got[:, ~empty_rows], want)
    # a masked row's output lanes are not specified (LSE -inf weighs them 0); the rest is exact
    ref = _ref_send(outs[0], lses[0], n, seq_lens=seq_lens.cpu(), query_start_loc=qsl.cpu())
    keep = torch.as_tensor(~empty_rows)
    assert torch.equal(bits_view(send.cpu())[:, keep], bits_view(ref)[:, keep])


def test_zero_rows_is_a_no_op(impl, device):
    n, h, d = 2, 4, 8
    out = torch.empty((0, h, d), dtype=torch.bfloat16, device=device)
    lse = torch.empty((0, h), device=device)
    send = torch.empty((n, 0, h // n, d + 2), dtype=torch.bfloat16, device=device)
    impl.pack_send(out, lse, send, n, h // n, d, 2)
