"""GPU tier: a send buffer past 2^31 elements packs and combines correctly (64-bit offsets)."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.testing.data import poison_like
from dcp_a2a.testing.gpumem import gpu_memory_share

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_send_buffer_over_2_pow_31_elements(impl, merge_check):
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs >= 24 GiB of GPU memory")
    # randn's float32 out (8 GiB, then 4 GiB as bfloat16), the send buffer (4 GiB), the merged
    # result (0.5 GiB): 16.0 GiB reserved at the peak on an H100. The tensors are the
    # function's, freed before the share is given back.
    with gpu_memory_share(18 * 2**30):
        _pack_and_combine_past_2_pow_31(impl, merge_check)


def _pack_and_combine_past_2_pow_31(impl, merge_check):
    n, b, h, d = 4, 65536, 64, 512
    dtype = torch.bfloat16
    p = impl.lse_pack_dim(dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    out = torch.randn((b, h, d), generator=g, device="cuda").to(dtype)
    lse = torch.randn((b, h), generator=g, device="cuda") * 4
    send = poison_like(torch.empty((n, b, h // n, d + p), dtype=dtype, device="cuda"))
    assert send.numel() > 2**31
    impl.pack_send(out, lse, send, n, h // n, d, p)
    # the buffer received by rank 0 if every peer had sent this one: recv[n] = send[0]; instead
    # combine the send buffer itself, whose slices are 4 different head groups of one rank
    merged, merged_lse = impl.unpack_combine(send, d, p, True, True)
    rows = torch.tensor([0, 1, 2**15 + 7, b - 2, b - 1], device="cuda")
    # oracle for the sampled rows: peer slice r holds heads r*H/N.. of `out`
    outs = out[rows].view(len(rows), n, h // n, d).transpose(0, 1).cpu()
    lses = lse[rows].view(len(rows), n, h // n).transpose(0, 1).cpu()
    merge_check(merged[rows].cpu(), merged_lse[rows].cpu(), outs, lses)
    # and the very last row of the last peer slice landed where the wire format says
    last = send[n - 1, b - 1, h // n - 1]
    assert torch.equal(last[:d], out[b - 1, h - 1])
