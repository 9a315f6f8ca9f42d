"""Triton's CPU interpreter rounds float32 -> bfloat16 as a GPU does once the harness is loaded
(dcp_a2a.testing.interpreter): a Triton store of float32 values into a bf16 tensor gives torch's
round-to-nearest-even bits (NaN aside, which the GPU writes as 0x7FC0)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dcp_a2a.testing.interpreter import f32_bits_to_bf16_bits, interpreting, round_bf16_like_gpu

pytestmark = pytest.mark.kernel


def _values():
    g = torch.Generator().manual_seed(3)
    ties = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -1.0 - 2 ** -8, 2 ** -126 * 1.5,
                         3.3895313892515355e38, 3.4028234663852886e38, 1e-40, -0.0, 0.0,
                         float("inf"), -float("inf"), 2 ** -8 * 1.5 + 1], dtype=torch.float32)
    return torch.cat([ties, torch.randn(4000, generator=g) * 10.0 ** torch.randint(
        -30, 30, (4000,), generator=g)])


def test_bit_rounding_matches_torch():
    x = _values()
    want = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = f32_bits_to_bf16_bits(x.view(torch.int32).numpy().view(np.uint32))
    assert np.array_equal(got, want)
    nan = torch.tensor([float("nan")]).view(torch.int32).numpy().view(np.uint32)
    assert f32_bits_to_bf16_bits(nan)[0] == 0x7FC0


@pytest.mark.skipif(not interpreting(), reason="a compiled Triton rounds on the GPU itself")
def test_a_triton_store_rounds_like_a_gpu():
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr):
        o = tl.arange(0, BLOCK)
        tl.store(dst + o, tl.load(src + o, mask=o < n) * 1.0, mask=o < n)

    assert round_bf16_like_gpu()
    x = _values()
    y = torch.empty(x.numel(), dtype=torch.bfloat16)
    copy[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    assert torch.equal(y.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
