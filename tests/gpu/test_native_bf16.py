"""GPU tier: the compiled combine's native bf16 rounding gives the integer rounding's bits for
every float32 value.

On sm_80 and newer the combine rounds its float32 sums to bf16 with the GPU's conversion
instruction (``merge_math.f32x2_to_bf16x2_native``, one instruction for two lanes, then a NaN
half set to 0x7FC0), where the CPU tier can only run the integer rounding
(``merge_math.f32_to_bf16_bits``: Triton's interpreter truncates), whose ties, overflow and NaN
the kernel tier checks against torch. Here both run compiled over all 2^32 float32 bit patterns,
each as a word's low half and, paired with another pattern, as its high half: a rounding mode,
denormal flush or NaN that differed anywhere would show. The CPU cannot run this (there is no
native path there).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from dcp_a2a.kernels import combine, tuning
from dcp_a2a.kernels.merge_math import (f32_to_bf16_bits, f32x2_to_bf16x2_native,
                                        join_pair_from_f32)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the native "
                       "rounding exists only compiled; the CPU tier runs the integer one)"),
]


@triton.jit
def _compare_kernel(counts_ptr, first_ptr, BLOCK: tl.constexpr, MIX: tl.constexpr):
    """For the BLOCK patterns of this program: counts[0] += single-lane mismatches,
    counts[1] += paired-word mismatches; first[k] = the smallest pattern of each kind."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    lo_bits = i.to(tl.int32)  # wraps: every 32-bit pattern once over the whole grid
    hi_bits = lo_bits * MIX  # odd: i -> i * MIX permutes the 32-bit words
    lo = lo_bits.to(tl.float32, bitcast=True)
    hi = hi_bits.to(tl.float32, bitcast=True)
    single = f32_to_bf16_bits(lo, True) != f32_to_bf16_bits(lo)
    pair = f32x2_to_bf16x2_native(lo, hi) != join_pair_from_f32(lo, hi, True)
    tl.atomic_add(counts_ptr, tl.sum(single.to(tl.int64), axis=0))
    tl.atomic_add(counts_ptr + 1, tl.sum(pair.to(tl.int64), axis=0))
    tl.atomic_min(first_ptr, tl.min(tl.where(single, i, 1 << 40), axis=0))
    tl.atomic_min(first_ptr + 1, tl.min(tl.where(pair, i, 1 << 40), axis=0))


def test_native_rounding_matches_the_integer_rounding_on_every_float32():
    if not combine.native_bf16(torch.bfloat16):
        pytest.skip("this GPU has no native bf16 conversion (before sm_80): the combine "
                    "rounds with integers there, as on the CPU")
    counts = torch.zeros(2, dtype=torch.int64, device="cuda")
    first = torch.full((2,), 1 << 40, dtype=torch.int64, device="cuda")
    block = 4096
    _compare_kernel[(2**32 // block,)](counts, first, BLOCK=block, MIX=0x9E3779B1 - 2**32,
                                       num_warps=8, enable_fp_fusion=False)
    single, pair = counts.tolist()
    f_single, f_pair = first.tolist()
    assert single == 0, (f"{single} float32 patterns rounded differently, the first "
                         f"{f_single & 0xFFFFFFFF:#010x}")
    assert pair == 0, (f"{pair} pairs rounded differently, the first with low half "
                       f"{f_pair & 0xFFFFFFFF:#010x}")


def test_the_combine_takes_the_native_rounding_where_the_table_says():
    """What the test above vouches for is what runs: a bf16 combine launch of at most
    ``NATIVE_BF16_MAX_WARPS`` warps asks for the native rounding here (sm_80+), one of more
    warps and a float16 one never do."""
    major, _ = torch.cuda.get_device_capability()
    seen = set()
    for b in (1, 64, 128, 256):  # decode batches: launches of 1 to 8 warps at H/N = 16
        recv = torch.zeros((8, b, 16, 512 + 2), dtype=torch.bfloat16, device="cuda")
        cfg = tuning.combine_launch(8, b, 16, 256)
        _, _, kw, _, _ = combine.combine_launch_args(recv, None, 8, b, 16, 512, 2, False, False)
        few = cfg.num_warps <= combine.NATIVE_BF16_MAX_WARPS
        assert kw["NATIVE_BF16"] is (major >= 8 and few), (b, cfg)
        _, _, kw16, _, _ = combine.combine_launch_args(recv.to(torch.float16), None, 8, b, 16,
                                                       512, 2, False, False)
        assert kw16["NATIVE_BF16"] is False
        seen.add(few)
    assert seen == {True, False}  # both kinds of launch were checked
