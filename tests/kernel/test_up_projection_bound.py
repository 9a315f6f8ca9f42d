"""The up-projection's bound (tolerances.yaml ``up_projection``) is tight and has power: inputs
built so that every rounding error has one sign take the project's kernels to 0.9+ of it in both
orders, and projections that round more than the derivation allows (TF32 inputs at fp32,
partial sums rounded to bf16) exceed it."""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.inprocess import lse_reduce_in_process
from dcp_a2a.reference import lse_weighted_combine
from dcp_a2a.testing.compare_projection import check_up_projection
from dcp_a2a.testing.data import heads_of, partials

pytestmark = pytest.mark.kernel

MANTISSA = {torch.bfloat16: 7, torch.float16: 10}


def _run(outs, lses, w, order, device):
    res = lse_reduce_in_process([o.to(device) for o in outs], [s.to(device) for s in lses],
                                w_uv=w.to(device), up_proj=order)
    n, _, h, _ = outs.shape
    return [check_up_projection(out.cpu(), None, outs, lses, w, order=order,
                                heads=heads_of(r, n, h)) for r, out in enumerate(res)]


@pytest.mark.parametrize("dtype,least", [(torch.bfloat16, 0.9), (torch.float16, 0.8)], ids=str)
def test_merge_first_bound_is_attained(device, dtype, least):
    """Two ranks of equal LSE whose latents are adjacent values of T: the merged latent lies
    halfway, rounds by half an ulp (ties to even: the sign known), and W is +-1 with that sign,
    so the projection adds up every rounding error: err = sum_l ulp(lam_l)/2, the bound's
    largest term (the rest: the fp32 dot's allowance, 3 L u sum|lam||W|, and the final half
    ulp). bf16 reaches >= 0.9 of the bound, fp16 >= 0.8 (its dot allowance is a larger share
    next to its finer rounding)."""
    m = MANTISSA[dtype]
    n, b, h, lat, v = 2, 1, 2, 256, 4
    g = torch.Generator().manual_seed(0)
    k = torch.randint(0, (1 << m) - 1, (b, h, lat), generator=g)
    o0 = 1 + k.double() * 2.0 ** -m
    outs = torch.stack([o0, o0 + 2.0 ** -m]).to(dtype)
    lses = torch.zeros(n, b, h)
    sign = torch.where(k % 2 == 0, -1.0, 1.0)  # ties to even: down from an even k, else up
    w = sign[0][..., None].expand(h, lat, v).to(dtype).contiguous()
    reps = _run(outs, lses, w, "after_merge", device)
    worst = max(r.output.worst_ratio for r in reps)
    assert all(r.ok for r in reps), "\n".join(r.describe() for r in reps)
    assert worst >= least, f"worst err/bound {worst:.3f}: the bound is looser than derived"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_project_first_bound_is_attained(device, dtype):
    """Two ranks of equal LSE whose projected partials 1 + t and 1 + ulp + t (t just under half
    an ulp) both round down by ~half an ulp, and whose merge 1 + ulp/2 then rounds down again
    (ties to even): err ~ 1 ulp = the bound's two half ulps (each rank's partial, the result)."""
    m = MANTISSA[dtype]
    n, b, h, lat, v = 2, 1, 2, 16, 4
    t = 2.0 ** -(m + 1) - 2.0 ** -(2 * m + 2)
    outs = torch.zeros(n, b, h, lat, dtype=torch.float64)
    outs[0, ..., 0], outs[1, ..., 0] = 1.0, 1.0 + 2.0 ** -m
    outs[:, ..., 1] = t
    outs = outs.to(dtype)
    assert outs[0, 0, 0, 1].double() == t  # t is a value of T
    w = torch.zeros(h, lat, v)
    w[:, 0:2, :] = 1.0
    reps = _run(outs, torch.zeros(n, b, h), w.to(dtype), "before_exchange", device)
    worst = max(r.output.worst_ratio for r in reps)
    assert all(r.ok for r in reps), "\n".join(r.describe() for r in reps)
    assert worst >= 0.99, f"worst err/bound {worst:.4f}: the bound is looser than derived"


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32's 10 explicit bits (nearest even)."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF).view(torch.float32)


def _dot_bf16_partial_sums(x, w, chunk=32):
    """x[..., L] @ w[L, V] with the running sum rounded to bf16 after every ``chunk`` products
    (a reduced-precision reduction)."""
    acc = None
    for k in range(0, x.shape[-1], chunk):
        part = torch.einsum("...l,lv->...v", x[..., k:k + chunk].double(),
                            w[k:k + chunk].double()).float()
        acc = part if acc is None else acc + part
        acc = acc.bfloat16().float()
    return acc


@pytest.mark.parametrize("order", ["after_merge", "before_exchange"])
def test_tf32_projection_exceeds_the_fp32_bound(order):
    """A projection of fp32 inputs through TF32 (torch.bmm under allow_tf32, or tl.dot's
    default) rounds them to 10 bits: 2^-11 relative, far above L u."""
    n, b, h, lat, v = 4, 4, 4, 512, 64
    outs, lses = partials(n, b, h, lat, torch.float32, seed=1)
    w = torch.randn(h, lat, v, generator=torch.Generator().manual_seed(1)) / math.sqrt(lat)
    if order == "after_merge":
        latent = lse_weighted_combine(outs, lses).float()
        y = torch.einsum("bhl,hlv->bhv", _tf32(latent).double(), _tf32(w).double()).float()
    else:
        p = torch.einsum("nbhl,hlv->nbhv", _tf32(outs).double(), _tf32(w).double()).float()
        y = lse_weighted_combine(p, lses).float()
    rep = check_up_projection(y, None, outs, lses, w, order=order)
    assert not rep.ok and rep.output.worst_ratio > 1.5, rep.describe()


def test_bf16_partial_sums_exceed_the_project_first_bound():
    """Project first with the dot's running sum rounded to bf16 every 32 products: each rank's
    projected partial is off by several ulps instead of half of one."""
    n, b, h, lat, v = 4, 4, 4, 512, 64
    outs, lses = partials(n, b, h, lat, torch.bfloat16, seed=1)
    w = (torch.randn(h, lat, v, generator=torch.Generator().manual_seed(1))
         / math.sqrt(lat)).to(torch.bfloat16)
    p = torch.stack([_dot_bf16_partial_sums(outs[:, :, hh], w[hh]) for hh in range(h)], dim=2)
    y = lse_weighted_combine(p.to(torch.bfloat16), lses).to(torch.bfloat16)
    rep = check_up_projection(y, None, outs, lses, w, order="before_exchange")
    assert not rep.ok and rep.output.worst_ratio > 2, rep.describe()


def _dot_partial_sums_in(x, w, dtype):
    """x[..., L] @ w[L, V] by recursive summation with every partial sum rounded to ``dtype``
    (a matmul whose reduction runs in the output dtype)."""
    acc = torch.zeros(*x.shape[:-1], w.shape[-1], dtype=torch.float64)
    for k in range(x.shape[-1]):
        acc = (acc + x[..., k:k + 1].double() * w[k].double()).to(dtype).double()
    return acc


def test_a_dot_summed_in_the_output_dtype_is_weaker_precision_and_a_wrong_head_is_not():
    """Partial sums rounded to fp16 (a library matmul in fp16): over the derived bound, inside
    the weaker design's (Higham's gamma_L of fp16), so a verdict of weaker precision; the same
    inputs projected with the next head's W_UV stay outside every bound: wrong numbers."""
    from dcp_a2a.testing.compare_projection import weaker_projection

    n, b, h, lat, v, dtype = 3, 2, 4, 32, 16, torch.float16
    outs, lses = partials(n, b, h, lat, dtype, seed=3)
    w = (torch.randn(h, lat, v, generator=torch.Generator().manual_seed(3))
         / math.sqrt(lat)).to(dtype)
    p = torch.stack([_dot_partial_sums_in(outs[:, :, hh], w[hh], dtype)
                     for hh in range(h)], dim=2)
    y = lse_weighted_combine(p.to(dtype), lses).to(dtype)
    rep = check_up_projection(y, None, outs, lses, w, order="before_exchange")
    assert not rep.ok, "fp16 partial sums stayed within the fp32-sum bound: no power here"
    assert weaker_projection(y, None, outs, lses, w, order="before_exchange") \
        == "dot_in_output_dtype"
    wrong = lse_weighted_combine(torch.einsum("nbhl,hlv->nbhv", outs.double(),
                                              w.roll(1, dims=0).double()).to(dtype), lses)
    assert weaker_projection(wrong.to(dtype), None, outs, lses, w,
                             order="before_exchange") is None
