"""Every launch configuration of the pack (row kernel, slab kernel, paired 32-bit lanes or not)
writes its send buffer and nothing around it. The conformance tier checks that for whatever
launch the table picks on the machine it runs on; on the CPU the interpreter's rule picks
other launches than the GPU's, so here every launch of the table runs on a send buffer carved
from the middle of a workspace of random bytes, with masked rows, and every byte before and
after it must come back unchanged."""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a.kernels import pack, tuning
from dcp_a2a.testing.conformance._spec import expected_send, raw_bits
from dcp_a2a.testing.data import guarded, partials

pytestmark = pytest.mark.kernel

# (dtype, N, H, D): the slab kernel fits the first two (32-bit lanes, 4 | lanes, 4 | H/N: bf16
# D = 80 as 40 paired words, fp32 D = 24); D = 7 moves one 16-bit lane at a time
CASES = [(torch.bfloat16, 2, 8, 80), (torch.float32, 2, 8, 24), (torch.float16, 2, 4, 7)]


@pytest.mark.parametrize("dtype,n,h,d", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_every_pack_launch_stays_inside_its_send_buffer(device, dtype, n, h, d):
    b = 6
    outs, lses = partials(1, b, h, d, dtype, seed=d, device=device)
    out, lse = outs[0], lses[0]
    qsl = torch.tensor([0, 2, 3, 5], dtype=torch.int32, device=device)  # row 5: padding
    seq_lens = torch.tensor([4, 0, 1], dtype=torch.int32, device=device)  # rows 2: empty
    empty = [False, False, True, False, False, True]
    p = dcp_a2a.lse_pack_dim(dtype)
    src, lanes, lanes_p, _ = pack.lanes_of(out, p)
    launches = tuning.every_launch("pack", b, h, lanes, n,
                                   pack.slab_fits(src, lanes, lanes_p, h // n))
    assert launches
    expected = expected_send(out, lse, n, empty_rows=empty)
    for i, cfg in enumerate(launches):
        send, outside = guarded((n, b, h // n, d + p), dtype, device, seed=i)
        tuning.OVERRIDES["pack"] = cfg
        try:
            dcp_a2a.pack_send(out, lse, send, n, h // n, d, p, seq_lens=seq_lens,
                              query_start_loc=qsl)
        finally:
            tuning.OVERRIDES.clear()
        wrote = outside()
        assert wrote is None, f"{cfg} wrote {wrote} (send)"
        got = raw_bits(send)
        got[:, empty, :, :d] = expected[:, empty, :, :d]  # masked rows' output lanes: free
        assert (got == expected).all(), f"{cfg} wrote the wrong words"
