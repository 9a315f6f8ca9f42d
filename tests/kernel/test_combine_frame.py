"""The combine's FRAME launch (``combine_rows`` reading each wire row from the 16-byte boundary
before it) writes the bits the row kernel writes, and nothing outside its output.

A wire row of D + 1 words starts k = 0-3 words past a 16-byte boundary; FRAME loads whole
groups of 4 words from there and the few lanes past them separately, then stores each lane at
its own place. The cases give every k (rows of an odd number of words), only 0 and 2 (rows of
4m + 2 words) and only 0, heads shorter than a group, heads of exactly a power of two lanes
and heads one lane short of one, identities and NaN partials in the rows, a wire that starts
4 bytes past a 16-byte boundary, and a problem FRAME does not fit (the row kernel runs)."""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a.kernels import combine, tuning
from dcp_a2a.kernels.launch import launch
from dcp_a2a.testing.data import bits_view, guarded, partials

pytestmark = pytest.mark.kernel

# (dtype, lanes: the row's 32-bit words before its LSE word): D = 2 x lanes for 16-bit dtypes
CASES = [(torch.float32, lanes) for lanes in (1, 2, 3, 4, 5, 7, 64, 127)] + [
    (dt, lanes) for dt in (torch.bfloat16, torch.float16) for lanes in (1, 2, 3, 5, 64)]


def _wire(n, b, hpr, d, dtype, device, *, shift_bytes=0):
    """A packed wire of random partials (identities and NaNs in some rows), at ``shift_bytes``
    past a 16-byte boundary."""
    p = dcp_a2a.lse_pack_dim(dtype)
    outs, lses = partials(1, b, n * hpr, d, dtype, seed=d + b, device=device)
    out, lse = outs[0].clone(), lses[0].clone()
    lse[0, 1] = float("-inf")  # a zero weight over a NaN partial
    out[0, 1, :] = float("nan")
    lse[-1, :] = float("-inf")  # a token with no KV anywhere
    nbytes = n * b * hpr * (d + p) * out.element_size()
    room = torch.zeros(nbytes + 16, dtype=torch.uint8, device=device)
    recv = room[shift_bytes:shift_bytes + nbytes].view(dtype).view(n, b, hpr, d + p)
    dcp_a2a.pack_send(out, lse, recv, n, hpr, d, p)
    return recv, p


def _run(recv, d, p, cfg, device, seed):
    """(frame taken, out bits, lse out bits) of one launch under ``cfg`` into guarded,
    poisoned buffers; fails if the launch wrote around them."""
    n, b, hpr, _ = recv.shape
    tuning.OVERRIDES["combine"] = cfg
    try:
        grid, args, kw, out, lse_out = combine.combine_launch_args(
            recv, None, n, b, hpr, d, p, True, False)
    finally:
        tuning.OVERRIDES.clear()
    out_g, out_outside = guarded(out.shape, out.dtype, device, seed=seed)
    lse_g, lse_outside = guarded(lse_out.shape, lse_out.dtype, device, seed=seed + 1)
    out_g.view(torch.uint8).fill_(0x7F)
    lse_g.fill_(float("nan"))
    out_bits = out_g.view(torch.int32) if kw["PAIRS"] else bits_view(out_g)
    args = args[:2] + (lse_g, out_g, out_bits, lse_g) + args[6:]
    launch(combine.combine_rows, grid, *args, **kw)
    for name, outside in (("out", out_outside), ("lse", lse_outside)):
        wrote = outside()
        assert wrote is None, f"{cfg} wrote {wrote} ({name})"
    return kw["FRAME"], bits_view(out_g).clone(), bits_view(lse_g).clone()


def _check(recv, d, p, device, expect_frame=True):
    row = _run(recv, d, p, tuning.Launch(1, 1 << 30, 2), device, seed=1)
    assert not row[0]
    for warps in (1, 2, 4):
        framed = _run(recv, d, p, tuning.Launch(1, 1 << 30, warps, frame=True), device,
                      seed=warps + 2)
        assert framed[0] is expect_frame, f"FRAME taken: {framed[0]}, expected {expect_frame}"
        for i, what in ((1, "output"), (2, "lse")):
            diff = framed[i] != row[i]
            assert not diff.any(), (
                f"FRAME ({warps} warps) {what} differs from the row kernel's at "
                f"{int(diff.sum())} of {diff.numel()} elements, first at "
                f"{tuple(int(x) for x in torch.nonzero(diff)[0])}")


@pytest.mark.parametrize("dtype,lanes", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_frame_writes_the_row_kernels_bits(device, dtype, lanes):
    # 2 ranks x 2 tokens x 2 heads: rank slices 4 x (lanes + 1) words apart (FRAME fits), rows
    # at every offset the row size allows
    d = lanes if dtype == torch.float32 else 2 * lanes
    recv, p = _wire(2, 2, 2, d, dtype, device)
    _check(recv, d, p, device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=lambda v: str(v).replace("torch.", ""))
def test_frame_on_a_wire_off_16_bytes(device, dtype):
    # the frame's groups then do not start on 16 bytes: the compiler may not use 16-byte
    # loads there, and the bits must not change
    d = 10 if dtype == torch.float32 else 20
    recv, p = _wire(3, 4, 2, d, dtype, device, shift_bytes=4)
    _check(recv, d, p, device)


def test_frame_falls_back_where_it_does_not_fit(device):
    # 3 tokens x 1 head of 4 + 1 words: rank slices 15 words apart, so the ranks' rows sit at
    # different offsets from a 16-byte boundary: the row kernel runs (the same bits)
    recv, p = _wire(2, 3, 1, 4, torch.float32, device)
    _check(recv, 4, p, device, expect_frame=False)
