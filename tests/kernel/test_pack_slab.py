"""The pack's slab kernel (16-byte stores of whole chunks of a peer's heads) writes exactly the
reference's wire buffer, and runs only where it fits.

The launch table gives it problems above 64k rows on a GPU; here it is asked for through
``tuning.OVERRIDES`` on small shapes, with a spy on its launcher, so that these tests cannot
pass on the row kernel. The shapes cover what the kernel's index arithmetic distinguishes: a
vector holding one head's LSE and the next head's first words at every offset (head words
W = 4 .. 40, not powers of two), chunks of 4 to 16 heads, peers whose head count is a
multiple of 4 but not a power of two (the chunk then takes 4 heads), masked rows, LSEs in
every input dtype with special bit patterns, and outputs with padded or non-unit strides.
"""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a import reference
from dcp_a2a.kernels import pack as pack_mod
from dcp_a2a.kernels import tuning
from dcp_a2a.testing.data import bits_view, poison_like

pytestmark = pytest.mark.kernel


@pytest.fixture
def slab(monkeypatch):
    """Ask for the slab kernel with ``heads`` heads a program; returns the list of the
    chunk sizes it ran with (one entry per launch)."""
    ran = []
    launch = pack_mod._launch_slab

    def spy(*args, **kw):
        ran.append(args[-2].block_h)  # (..., cfg, wide)
        return launch(*args, **kw)

    monkeypatch.setattr(pack_mod, "_launch_slab", spy)

    def ask(heads, warps=2):
        monkeypatch.setitem(tuning.OVERRIDES, "pack", tuning.Launch(heads, 1024, warps,
                                                                     slab=True))
        return ran
    return ask


def _pack_both(device, out, lse, n, **mask):
    b, h, d = out.shape
    p = dcp_a2a.lse_pack_dim(out.dtype)
    shape = (n, b, h // n, d + p)
    got = poison_like(torch.empty(shape, dtype=out.dtype, device=device))
    dcp_a2a.pack_send(out, lse, got, n, h // n, d, p, **mask)
    want = poison_like(torch.empty(shape, dtype=out.dtype))
    reference.pack_send(out.cpu(), lse.cpu(), want, n, h // n, d, p,
                        **{k: v.cpu() for k, v in mask.items()})
    return got.cpu(), want


def _inputs(b, h, d, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(b, h, d, generator=g).to(dtype)
    lse = torch.randn(b, h, generator=g) * 6
    return out.to(device), lse.to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("n, h, d, heads", [
    (2, 8, 8, 4),      # the smallest chunk: 4 heads of 4 (16-bit) or 8 (fp32) words
    (1, 12, 40, 8),    # 12 heads a peer: a chunk of 4 whatever is asked
    (4, 32, 80, 8),    # D = 80 (40 words in 16 bits), 8 heads a chunk
    (2, 32, 24, 16),   # a chunk of all 16 of a peer's heads
])
def test_slab_kernel_writes_the_reference_wire(device, slab, dtype, n, h, d, heads):
    ran = slab(heads)
    out, lse = _inputs(3, h, d, dtype, device, seed=h + d)
    got, want = _pack_both(device, out, lse, n)
    assert ran, "the slab kernel did not run"
    hpr = h // n
    assert ran[-1] == min(heads, hpr & -hpr)
    assert torch.equal(bits_view(got), bits_view(want))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_slab_kernel_masks_rows_and_keeps_lse_bits(device, slab, dtype):
    """Empty-shard and padding rows go out with LSE -inf; every other LSE keeps its exact
    fp32 bits (NaN payloads, -0.0, subnormals), whatever its input dtype."""
    ran = slab(4)
    b, h, d, n = 5, 8, 16, 2
    out, _ = _inputs(b, h, d, dtype, device, seed=3)
    specials = torch.tensor([0x7FC00001, 0x80000000 - 2**32, 0x00000001, 0x7F800000,
                             0xFF800000 - 2**32, 0x3F800000, 0xC2C80000 - 2**32, 0x007FFFFF],
                            dtype=torch.int32)
    lse = specials.repeat(b)[: b * h].view(b, h).view(torch.float32).to(device)
    seq_lens = torch.tensor([3, 0, 2], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 1, 3, 4], dtype=torch.int32, device=device)  # row 4: padding
    got, want = _pack_both(device, out, lse, n, seq_lens=seq_lens, query_start_loc=qsl)
    assert ran
    assert torch.equal(bits_view(got), bits_view(want))
    for lse_dtype in (torch.bfloat16, torch.float16):
        low = (torch.randn(b, h) * 9).to(lse_dtype).to(device)
        got, want = _pack_both(device, out, low, n)
        assert torch.equal(bits_view(got), bits_view(want)), lse_dtype


def test_slab_kernel_reads_strided_outputs(device, slab):
    """Heads and tokens padded apart by whole 16-byte vectors take the slab kernel (16-bit,
    moved as words, and fp32), with a column-major LSE; an output whose rows are not runs of
    16-byte vectors takes the row kernel."""
    ran = slab(8)
    b, h, d, n = 3, 16, 24, 2
    lse = (torch.randn(h, b) * 4).to(device).t()  # [b, h], column-major
    for dtype, pad in ((torch.bfloat16, 8), (torch.float32, 4)):
        padded = torch.randn(b, h + 1, d + pad).to(dtype).to(device)[:, :h, :d]
        got, want = _pack_both(device, padded, lse, n)
        assert ran and torch.equal(bits_view(got), bits_view(want)), dtype
    assert len(ran) == 2
    for out in (torch.randn(d, h, b).to(device).permute(2, 1, 0),  # no unit stride
                torch.randn(b, h, d + 2).to(device)[:, :, :d]):      # rows 2 words apart
        got, want = _pack_both(device, out, lse, n)
        assert len(ran) == 2 and torch.equal(bits_view(got), bits_view(want))


@pytest.mark.parametrize("dtype, n, h, d, why", [
    (torch.bfloat16, 2, 8, 7, "odd D: 16-bit lanes, two LSE lanes"),
    (torch.bfloat16, 2, 8, 6, "3 words a head"),
    (torch.float32, 4, 8, 8, "2 heads a peer"),
    (torch.float32, 2, 8, 10, "10 words a head"),
])
def test_the_row_kernel_takes_what_the_slab_kernel_cannot(device, slab, dtype, n, h, d, why):
    ran = slab(4)
    out, lse = _inputs(2, h, d, dtype, device, seed=d)
    got, want = _pack_both(device, out, lse, n)
    assert not ran, why
    assert torch.equal(bits_view(got), bits_view(want))
