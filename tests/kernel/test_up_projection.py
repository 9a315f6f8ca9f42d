"""The project's up-projected lse_reduce: both orders forced (``up_proj=``), every backend, into=,
the switch point of ``up_proj="auto"``, DeepSeek-V3's shapes, and the projection kernel alone."""

from __future__ import annotations

import math

import pytest
import torch

import dcp_a2a
from dcp_a2a import Group, up_projection
from dcp_a2a.inprocess import lse_reduce_in_process
from dcp_a2a.kernels.project import project
from dcp_a2a.testing.compare_projection import check_up_projection
from dcp_a2a.testing.data import bits_view, heads_of, partials
from dcp_a2a.testing.mirror import MirrorGroup

pytestmark = pytest.mark.kernel

ORDERS = ("before_exchange", "after_merge")


def _w(h, lat, v, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(500 + seed)
    return (torch.randn(h, lat, v, generator=g) / math.sqrt(lat)).to(dtype).to(device)


def _check_all(results, outs, lses, w, order, *, base_e=True, kind="a2a", return_lse=True):
    n, _, h, _ = outs.shape
    worst = 0.0
    for r, res in enumerate(results):
        out, lse = res if return_lse else (res, None)
        # on the partials' device: float64 oracles of DeepSeek-V3's shapes take the GPU seconds
        rep = check_up_projection(out, lse, outs, lses, w, order=order, is_lse_base_on_e=base_e,
                                  kind=kind, heads=heads_of(r, n, h))
        assert rep.ok, f"rank {r}, {order}:\n{rep.describe()}"
        worst = max(worst, rep.worst_ratio)
    return worst


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs", "symm_mem"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype,base_e", [(torch.bfloat16, True), (torch.float16, False),
                                          (torch.float32, True)], ids=str)
def test_every_backend_both_orders(device, backend, order, dtype, base_e):
    """N = 3, V = 20 (not a power of two), L = 40: within the bound of the order forced, on
    every backend; the LSE is the merge's."""
    n, b, h, lat, v = 3, 2, 6, 40, 20
    outs, lses = partials(n, b, h, lat, dtype, seed=3, device=device)
    w = _w(h, lat, v, dtype, device=device)
    res = lse_reduce_in_process(list(outs), list(lses), return_lse=True, backend=backend,
                                is_lse_base_on_e=base_e, w_uv=w, up_proj=order)
    _check_all(res, outs, lses, w, order, base_e=base_e,
               kind="ag_rs" if backend == "ag_rs" else "a2a")


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs", "symm_mem"])
@pytest.mark.parametrize("order", ORDERS)
def test_into_on_every_backend(device, backend, order):
    """into= (a strided view) with w_uv on every backend: the result in the caller's buffer,
    bit for bit the result without it, nothing around it written."""
    n, b, h, lat, v = 2, 3, 4, 16, 12
    outs, lses = partials(n, b, h, lat, torch.bfloat16, seed=5, device=device)
    w = _w(h, lat, v, torch.bfloat16, device=device)
    want = lse_reduce_in_process(list(outs), list(lses), backend=backend, w_uv=w,
                                 up_proj=order)
    frames = [torch.full((b, h // n, v + 2), float("nan"), dtype=torch.bfloat16, device=device)
              for _ in range(n)]
    into = [f[..., 1:v + 1] for f in frames]
    got = lse_reduce_in_process(list(outs), list(lses), backend=backend, w_uv=w, up_proj=order,
                                into=into)
    for r in range(n):
        assert got[r] is into[r]
        assert torch.equal(bits_view(got[r].contiguous()), bits_view(want[r]))
        assert torch.isnan(frames[r][..., 0]).all() and torch.isnan(frames[r][..., -1]).all()


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs", "symm_mem"])
def test_into_without_projection_on_every_backend(device, backend):
    n, b, h, d = 3, 2, 6, 10
    outs, lses = partials(n, b, h, d, torch.float16, seed=6, device=device)
    want = lse_reduce_in_process(list(outs), list(lses), return_lse=True, backend=backend)
    into = [torch.full((h // n, b, d), float("nan"), dtype=torch.float16,
                       device=device).transpose(0, 1) for _ in range(n)]
    got = lse_reduce_in_process(list(outs), list(lses), return_lse=True, backend=backend,
                                into=into)
    for r in range(n):
        assert got[r][0] is into[r]
        assert torch.equal(bits_view(into[r].contiguous()), bits_view(want[r][0]))
        assert torch.equal(got[r][1], want[r][1])


@pytest.mark.parametrize("order", ORDERS)
def test_deepseek_v3_shapes(device, order):
    """H = 128, L = 512, V = 128, bfloat16, 2 ranks of one token on the CPU (the GPU test below
    runs the full sizes)."""
    n, b = 2, 1
    outs, lses = partials(n, b, 128, 512, torch.bfloat16, seed=1, device=device)
    w = _w(128, 512, 128, torch.bfloat16, device=device)
    res = lse_reduce_in_process(list(outs), list(lses), return_lse=True, w_uv=w, up_proj=order)
    _check_all(res, outs, lses, w, order)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("b", [1, 64, 1024])
@pytest.mark.parametrize("order", ORDERS)
def test_deepseek_v3_shapes_on_the_gpu(n, b, order):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    outs, lses = partials(n, b, 128, 512, torch.bfloat16, seed=b, device="cuda")
    w = _w(128, 512, 128, torch.bfloat16, device="cuda")
    res = lse_reduce_in_process(list(outs), list(lses), return_lse=True, w_uv=w, up_proj=order)
    _check_all(res, outs, lses, w, order)


# the interpreter's projection multiplies the inf partials of rows of weight 0 (masked after)
@pytest.mark.filterwarnings("ignore:invalid value encountered in reduce:RuntimeWarning")
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("case", ["zero_partial", "empty_shard", "minus_inf_rows",
                                  "v_not_pow2"])
def test_awkward_inputs(device, order, base_e, case):
    n, b, h, lat, v = 3, 4, 3, 24, 8
    if case == "v_not_pow2":
        lat, v = 40, 100
    outs, lses = partials(n, b, h, lat, torch.bfloat16, seed=8, device=device)
    outs, lses = outs.clone(), lses.clone()
    if case == "zero_partial":
        outs[0] = 0.0
    elif case == "empty_shard":  # rank 1 has no KV at all: every row -inf, garbage partial
        lses[1] = -math.inf
        outs[1] = math.nan
    elif case == "minus_inf_rows":
        lses[:, 1] = -math.inf
        outs[:, 1] = math.inf
    w = _w(h, lat, v, torch.bfloat16, device=device)
    res = lse_reduce_in_process(list(outs), list(lses), return_lse=True, w_uv=w, up_proj=order,
                                is_lse_base_on_e=base_e)
    for out, lse in res:
        assert not torch.isnan(out).any()
        if case == "minus_inf_rows":
            assert torch.all(out[1] == 0) and torch.all(lse[1] == -math.inf)
    _check_all(res, outs, lses, w, order, base_e=base_e)


@pytest.mark.parametrize("order", ORDERS)
def test_masks(device, order):
    n, b, h, lat, v = 2, 5, 4, 16, 8
    outs, lses = partials(n, b, h, lat, torch.float16, seed=4, device=device)
    outs, lses = outs.clone(), lses.clone()
    qsl = torch.tensor([0, 2, 4], dtype=torch.int32, device=device)
    seq_lens = [torch.tensor([3, 3], dtype=torch.int32, device=device),
                torch.tensor([0, 3], dtype=torch.int32, device=device)]
    outs[1, 0:2] = math.nan
    w = _w(h, lat, v, torch.float16, device=device)
    res = lse_reduce_in_process(list(outs), list(lses), return_lse=True, w_uv=w, up_proj=order,
                                seq_lens=seq_lens, query_start_loc=qsl)
    effective = lses.clone()
    effective[1, 0:2] = -math.inf
    effective[:, 4] = -math.inf
    for out, lse in res:
        assert torch.all(out[4] == 0) and torch.all(lse[4] == -math.inf)
    _check_all(res, outs, effective, w, order)


def test_world_size_one(device):
    outs, lses = partials(1, 3, 2, 16, torch.float32, seed=2, device=device)
    w = _w(2, 16, 8, torch.float32, device=device)
    for order in ORDERS:
        out, lse = dcp_a2a.lse_reduce(outs[0], lses[0], Group(1, 0, None), w_uv=w,
                                      up_proj=order, return_lse=True)
        rep = check_up_projection(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), w.cpu(),
                                  order=order)
        assert rep.ok, rep.describe()


class _Bytes(MirrorGroup):
    def __init__(self, size, rank):
        super().__init__(size, rank)
        self.sent = []

    def all_to_all_single(self, output, input, *a, **k):
        self.sent.append(input.shape[-1])
        return super().all_to_all_single(output, input, *a, **k)


@pytest.mark.parametrize("n", [2, 4])
def test_auto_projects_first_exactly_from_the_switch_point(device, n):
    """up_proj="auto" sends V + P lanes a head from switch_point(...) on and L + P below it."""
    h, lat, v = 4, 32, 8
    at = up_projection.switch_point(torch.device(device), n, h, lat, v, torch.bfloat16)
    assert at is not None and at > 1
    w = _w(h, lat, v, torch.bfloat16, device=device)
    for b in (1, at - 1, at, at + 1):
        outs, lses = partials(1, b, h, lat, torch.bfloat16, seed=b, device=device)
        pg = _Bytes(n, 0)
        dcp_a2a.lse_reduce(outs[0], lses[0], Group(n, 0, pg), w_uv=w)
        assert pg.sent == [(v if b >= at else lat) + 2], (b, at, pg.sent)


def test_symm_mem_takes_the_order_its_buffers_hold(device):
    """symm_mem carries one head width: "auto" takes the order of the SymmMemBuffers' head_dim
    (V: projected first, even below the switch point); an order they cannot carry, and buffers
    of neither width, are a ValueError."""
    from dcp_a2a.symm_mem import SymmMemBuffers

    n, b, h, lat, v = 2, 1, 4, 16, 8
    outs, lses = partials(n, b, h, lat, torch.float32, seed=1, device=device)
    w = _w(h, lat, v, torch.float32, device=device)
    for width, order in ((v, "before_exchange"), (lat, "after_merge")):
        bufs = SymmMemBuffers.in_process(n, max_tokens=b, num_heads=h, head_dim=width,
                                         dtype=torch.float32, device=device)
        res = lse_reduce_in_process(list(outs), list(lses), return_lse=True, w_uv=w,
                                    backend="symm_mem", buffers=bufs)
        _check_all(res, outs, lses, w, order)
        other = "after_merge" if order == "before_exchange" else "before_exchange"
        with pytest.raises(ValueError, match="SymmMemBuffers hold head_dim"):
            dcp_a2a.lse_reduce_steps(outs[0], lses[0], n, 0, w_uv=w, up_proj=other,
                                     backend="symm_mem", buffers=bufs[0])
    bufs = SymmMemBuffers.in_process(n, max_tokens=b, num_heads=h, head_dim=5,
                                     dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="head_dim=5"):
        dcp_a2a.lse_reduce_steps(outs[0], lses[0], n, 0, w_uv=w, backend="symm_mem",
                                 buffers=bufs[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(3, 4, 40, 24), (1, 2, 512, 128), (17, 2, 7, 100)])
def test_projection_kernel_rounds_one_fp32_dot_product(device, dtype, shape):
    """project(): one dot product of length L in fp32 per element, rounded once (nearest
    even): within c L u sum|x||w| + half an ulp of the float64 product, strided inputs and
    output included."""
    b, h, lat, v = shape
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(h, b, lat, generator=g).to(dtype).to(device).transpose(0, 1)  # strided
    w = (torch.randn(h, lat, v, generator=g) / math.sqrt(lat)).to(dtype).to(device)
    frame = torch.full((b, h, v + 1), float("nan"), dtype=dtype, device=device)
    y = project(x, w, frame[..., :v])
    exact = torch.einsum("bhl,hlv->bhv", x.double(), w.double()).cpu()
    mag = torch.einsum("bhl,hlv->bhv", x.double().abs(), w.double().abs()).cpu()
    c = 1.0 if dtype == torch.float32 else 3.0
    from dcp_a2a.testing import tolerances as tol

    allowance = c * lat * 2.0 ** -24 * mag
    bound = 0.5 * tol.ulp(exact.abs() + allowance, dtype) + allowance
    err = (y.cpu().double() - exact).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    assert torch.isnan(frame[..., v]).all()


def test_projection_kernel_empty_shapes(device):
    x = torch.randn(0, 2, 8, device=device)
    assert project(x, torch.randn(2, 8, 4, device=device),
                   torch.empty(0, 2, 4, device=device)).shape == (0, 2, 4)
    y = torch.full((2, 2, 4), 7.0, device=device)
    project(torch.randn(2, 2, 0, device=device), torch.randn(2, 0, 4, device=device), y)
    assert torch.all(y == 0)  # an empty sum
