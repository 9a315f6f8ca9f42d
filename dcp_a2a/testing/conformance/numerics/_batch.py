"""The batch-invariance check at a large batch (1024 rows, test_determinism.py)."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.reference import wire as reference_wire
from dcp_a2a.testing.data import DTYPES, bits_view, partials, poison_like
from dcp_a2a.testing.exchange import merge_heads

POOL = 1024


@pytest.fixture(scope="module")
def pool():
    """[N=2, 1024 rows, H=2, D=8] partials per dtype, LSE spreads of 8 nats."""
    return {dt: partials(2, POOL, 2, 8, dt, seed=10, spread=8.0) for dt in DTYPES}


def check_large_batch(impl, device, pool, rows):
    """One launch of unpack_combine over a ``rows``-row wire buffer (built from the wire
    format's specification, :mod:`dcp_a2a.reference.wire`; or one merge of the rows, without a
    wire); rows at the first, a middle and the last position equal the same rows combined
    alone, bit for bit."""
    dtype = torch.bfloat16
    outs, lses = (t[:, :rows] for t in pool[dtype])
    n, b, h, d = outs.shape
    if not (impl.has("unpack_combine") and impl.has("lse_pack_dim")):
        base_e = impl.envelope.base_e
        outs, lses = outs.to(device), lses.to(device)
        big_out, big_lse = merge_heads(impl, outs, lses, 0, return_lse=True, base_e=base_e)
        for row in (0, rows // 2 + 3, rows - 1):
            one_out, one_lse = merge_heads(impl, outs[:, row:row + 1], lses[:, row:row + 1], 0,
                                           return_lse=True, base_e=base_e)
            assert torch.equal(bits_view(one_out[0].cpu()), bits_view(big_out[row].cpu())), row
            assert torch.equal(bits_view(one_lse[0].cpu()), bits_view(big_lse[row].cpu())), row
        return
    p = impl.lse_pack_dim(dtype)
    send = [poison_like(torch.empty((n, b, h // n, d + p), dtype=dtype)) for _ in range(n)]
    for r in range(n):
        reference_wire.pack_send(outs[r], lses[r], send[r], n, h // n, d, p)
    recv = torch.stack(send)[:, 0].contiguous().to(device)  # rank 0's receive buffer
    big_out, big_lse = impl.unpack_combine(recv, d, p, True, True)
    for row in (0, rows // 2 + 3, rows - 1):
        one_out, one_lse = impl.unpack_combine(recv[:, row:row + 1].contiguous(), d, p, True,
                                               True)
        assert torch.equal(bits_view(one_out[0].cpu()), bits_view(big_out[row].cpu())), row
        assert torch.equal(bits_view(one_lse[0].cpu()), bits_view(big_lse[row].cpu())), row
