"""The combine rounds its float32 sum to bf16/fp16 to nearest, ties to even, bit for bit.

The kernels round bf16 with integer arithmetic of their own (``merge_math.f32_to_bf16_bits``).
The merge bound of tolerances.yaml cannot see a tie broken the wrong way: the error is 0.5 ulp
either way, which the bound allows, so a rounding that breaks ties to odd or rounds 0.50002 ulp
down passes every conformance test. Here every element is an exact tie: two ranks with equal
LSEs hold adjacent representable values a and b, the weights are exactly 1/2, the float32 sum
a/2 + b/2 is exact, and only the rounding decides the result. Expected: torch's own
float32 -> dtype conversion (round to nearest even), of the exact midpoint.
"""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a.testing.conformance._spec import build_recv
from dcp_a2a.testing.data import bits_view

pytestmark = pytest.mark.kernel


def _adjacent_pairs(dtype, count, seed):
    """(a, b): ``count`` random finite values of ``dtype`` (both signs, many binades, odd and even
    last bits) and each one's neighbour one ulp further from zero."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(count, generator=g) * torch.exp2(torch.randint(-8, 9, (count,),
                                                                     generator=g).float()))
    a = a.to(dtype)
    b = (bits_view(a) + 1).view(dtype)  # the next value away from zero
    keep = torch.isfinite(b.float()) & (a != 0)
    return a[keep], b[keep]


@pytest.mark.parametrize("d", [6, 5], ids=["d_even", "d_odd"])  # paired and single lanes
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_ties_round_to_even(device, dtype, d):
    a, b = _adjacent_pairs(dtype, 40 * d, seed=d)
    rows = a.numel() // d
    a, b = a[:rows * d].view(rows, 1, d), b[:rows * d].view(rows, 1, d)
    # two ranks, two heads: rank 0 owns head 0, whose partials are a (rank 0) and b (rank 1)
    outs = torch.stack([torch.cat([a, a], dim=1), torch.cat([b, b], dim=1)])
    lses = torch.zeros(2, rows, 2)  # equal LSEs: weights exactly 1/2 each
    recv = build_recv(outs, lses, 0).to(device)
    got = dcp_a2a.unpack_combine(recv, d, dcp_a2a.lse_pack_dim(dtype), False, True).cpu()
    midpoint = (a.double() + b.double()) / 2  # exact in float32 too
    want = midpoint.float().to(dtype)
    assert bool((midpoint.float().double() == midpoint).all())
    wrong = bits_view(got) != bits_view(want)
    assert not wrong.any(), (
        f"{int(wrong.sum())} of {wrong.numel()} ties not rounded to even; first: "
        f"{a[wrong][0].item()!r} and {b[wrong][0].item()!r} gave {got[wrong][0].item()!r}, "
        f"expected {want[wrong][0].item()!r}")
