"""GPU tier: the comparison helper takes partials that live on the GPU (the accuracy job's
NCCL ranks hand it CUDA tensors; a bound computed on the GPU next to errors on the host broke
the first 4-GPU run)."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.testing.compare import check_merge
from dcp_a2a.reference import lse_weighted_combine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_check_merge_of_cuda_partials(dtype):
    g = torch.Generator(device="cuda").manual_seed(3)
    outs = torch.randn((4, 8, 16, 40), generator=g, device="cuda").to(dtype)
    lses = torch.randn((4, 8, 16), generator=g, device="cuda") * 4
    exact, exact_lse = lse_weighted_combine(outs, lses, return_lse=True)
    rep = check_merge(exact.to(dtype), exact_lse.float(), outs, lses)
    assert rep.output.failures == 0 and rep.lse.failures == 0
    # and it still fails what it should: one element off by 64 ulps of its value
    bad = exact.to(dtype).clone()
    bad[0, 0, 0] = bad[0, 0, 0] * (1 + 64 * torch.finfo(dtype).eps) + torch.finfo(dtype).eps
    assert check_merge(bad, exact_lse.float(), outs, lses).output.failures >= 1
