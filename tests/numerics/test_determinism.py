"""Determinism and batch invariance, bitwise.

* Repeated calls on the same inputs give identical bits (send buffers and merged results).
* A row's merged result does not depend on the batch it is in: the row alone equals the same
  row inside batches of 2..1024 rows at the first, a middle and the last position. Small
  batches go through the whole contract exchange (pack_send + unpack_combine); the 1024-row
  batches (64 rows here; 1024 in test_batch_invariance_1024.py, numerics tier only), whose cost on the CPU interpreter is one
  program per row, feed unpack_combine a wire buffer built from the wire format's specification
  (reference.pack_send) to keep CI time low.
"""

from __future__ import annotations

import pytest
import torch

import reference
from tests._data import DTYPES, bits_view, partials, poison_like
from tests.numerics import _exchange

pytestmark = [pytest.mark.numerics, pytest.mark.conformance]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_repeated_calls_are_bitwise_identical(exchange, dtype):
    outs, lses = partials(4, 1, 8, 40, dtype, seed=9, spread=6.0)
    first = exchange.merge(outs, lses)
    sends = _exchange._send_buffers(exchange.impl, outs.to(exchange.device),
                                    lses.to(exchange.device))
    for _ in range(2):
        again = exchange.merge(outs, lses)
        for a, b in zip(first, again):
            assert torch.equal(bits_view(a), bits_view(b))
        s = _exchange._send_buffers(exchange.impl, outs.to(exchange.device),
                                    lses.to(exchange.device))
        assert torch.equal(bits_view(s), bits_view(sends))


def _batch_with(rows_out, rows_lse, target, size, pos, seed):
    """A batch of ``size`` rows from the pool with row ``target`` placed at ``pos``."""
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, rows_out.shape[1], (size,), generator=g)
    pick[pos] = target
    return rows_out[:, pick], rows_lse[:, pick]


POOL = 1024


@pytest.fixture(scope="module")
def pool():
    """[N=2, 1024 rows, H=2, D=8] partials per dtype, LSE spreads of 8 nats."""
    return {dt: partials(2, POOL, 2, 8, dt, seed=10, spread=8.0) for dt in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_invariance_through_the_exchange(exchange, pool, dtype):
    outs, lses = pool[dtype]
    target = 5
    alone, _ = exchange.merge_rank(outs[:, target:target + 1], lses[:, target:target + 1], 0)
    for size in (2, 9):
        for pos in sorted({0, size // 2, size - 1}):
            bo, bl = _batch_with(outs, lses, target, size, pos, seed=size * 31 + pos)
            got, _ = exchange.merge_rank(bo, bl, 0)
            for a, b in zip(alone, got):
                assert torch.equal(bits_view(a[0]), bits_view(b[pos])), (size, pos)


@pytest.mark.parametrize("rows", [64])
def test_batch_invariance_large_batch(impl, device, pool, rows):
    """One launch of unpack_combine over a ``rows``-row wire buffer; rows at the first, a
    middle and the last position equal the same rows combined alone, bit for bit. (One program
    per row: 1024 rows cost ~40 s on the CPU interpreter, hence the slow mark.)"""
    dtype = torch.bfloat16
    outs, lses = (t[:, :rows] for t in pool[dtype])
    n, b, h, d = outs.shape
    p = impl.lse_pack_dim(dtype)
    send = [poison_like(torch.empty((n, b, h // n, d + p), dtype=dtype)) for _ in range(n)]
    for r in range(n):
        reference.pack_send(outs[r], lses[r], send[r], n, h // n, d, p)
    recv = torch.stack(send)[:, 0].contiguous().to(device)  # rank 0's receive buffer
    big_out, big_lse = impl.unpack_combine(recv, d, p, True, True)
    for row in (0, rows // 2 + 3, rows - 1):
        one_out, one_lse = impl.unpack_combine(recv[:, row:row + 1].contiguous(), d, p, True,
                                               True)
        assert torch.equal(bits_view(one_out[0].cpu()), bits_view(big_out[row].cpu())), row
        assert torch.equal(bits_view(one_lse[0].cpu()), bits_view(big_lse[row].cpu())), row

