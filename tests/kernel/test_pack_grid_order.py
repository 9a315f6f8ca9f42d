"""The pack on a head-major grid (programs dispatched along a token's heads, tokens on the
grid's second axis) writes exactly the reference's wire buffer, in both pack kernels.

The launch table picks that order for heads of 512 lanes above 8k rows on a GPU; here it is
asked for through ``tuning.OVERRIDES`` on small shapes, with a spy on the kernels' launch grids,
so that these tests cannot pass on a token-major launch. Tokens and head blocks differ in
number, so a kernel reading its token from the wrong axis writes rows that do not exist or
leaves rows unwritten (the buffers start poisoned).
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


class _GridSpy:
    """Stands in for a Triton kernel: records each launch grid, then launches."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(tuple(grid))
        return self.kernel[grid]


@pytest.fixture
def grids(monkeypatch):
    spies = {name: _GridSpy(getattr(pack_mod, name))
             for name in ("_pack_kernel", "_pack_slab_kernel")}
    for name, spy in spies.items():
        monkeypatch.setattr(pack_mod, name, spy)
    return spies


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kernel, heads, warps", [("_pack_kernel", 1, 1),
                                                  ("_pack_kernel", 2, 2),
                                                  ("_pack_slab_kernel", 4, 2)])
@pytest.mark.parametrize("masked", [False, True], ids=["all_rows", "masked"])
def test_head_major_pack_writes_the_reference_wire(device, grids, monkeypatch, dtype, kernel,
                                                   heads, warps, masked):
    b, h, d, n = 3, 16, 24, 2
    p = dcp_a2a.lse_pack_dim(dtype)
    g = torch.Generator().manual_seed(heads + d)
    out = torch.randn(b, h, d, generator=g).to(dtype)
    lse = torch.randn(b, h, generator=g) * 6
    mask = {}
    if masked:  # request 1 has no local KV; row 2 is padding
        mask = dict(seq_lens=torch.tensor([3, 0], dtype=torch.int32),
                    query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32))
    monkeypatch.setitem(tuning.OVERRIDES, "pack", tuning.Launch(
        heads, 1024, warps, slab=kernel == "_pack_slab_kernel", head_major=True))
    shape = (n, b, h // n, d + p)
    got = poison_like(torch.empty(shape, dtype=dtype, device=device))
    dcp_a2a.pack_send(out.to(device), lse.to(device), got, n, h // n, d, p,
                      **{k: v.to(device) for k, v in mask.items()})
    want = poison_like(torch.empty(shape, dtype=dtype))
    reference.pack_send(out, lse, want, n, h // n, d, p, **mask)
    assert grids[kernel].grids == [(h // heads, b)], "not a head-major launch of " + kernel
    assert torch.equal(bits_view(got.cpu()), bits_view(want))
