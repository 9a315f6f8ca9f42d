"""Determinism and batch invariance, bitwise.

* Repeated calls on the same inputs give identical bits (send buffers and merged results).
* A row's merged result does not depend on the batch it is in: the row alone equals the same
  row inside batches of 2..1024 rows at the first, a middle and the last position. Small
  batches go through the whole contract exchange (pack_send + unpack_combine); the 1024-row
  batch feeds unpack_combine a wire buffer built from the wire format's specification
  (dcp_a2a.reference.wire.pack_send).
"""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.testing.conformance.numerics._batch import check_large_batch, pool  # noqa: F401
from dcp_a2a.testing.data import DTYPES, bits_view, partials
from dcp_a2a.testing.exchange import pack_all, packed

pytestmark = [pytest.mark.numerics, pytest.mark.conformance, pytest.mark.clause("merge bound")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_repeated_calls_are_bitwise_identical(exchange, dtype):
    """The same inputs merge (and, with a wire, pack) to the same bits call after call."""
    d = exchange.impl.envelope.fit_head_dim(40)
    outs, lses = partials(4, 1, 8, d, dtype, seed=9, spread=6.0)
    wire = packed(exchange.impl)

    def sends():
        return torch.stack(pack_all(exchange.impl, outs.to(exchange.device),
                                    lses.to(exchange.device))) if wire else None

    first, first_sends = exchange.merge(outs, lses), sends()
    for _ in range(2):
        again = exchange.merge(outs, lses)
        for a, b in zip(first, again):
            assert torch.equal(bits_view(a), bits_view(b))
        if wire:
            assert torch.equal(bits_view(sends()), bits_view(first_sends))


def _batch_with(rows_out, rows_lse, target, size, pos, seed):
    """A batch of ``size`` rows from the pool with row ``target`` placed at ``pos``."""
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, rows_out.shape[1], (size,), generator=g)
    pick[pos] = target
    return rows_out[:, pick], rows_lse[:, pick]


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


def test_batch_invariance_large_batch(impl, device, pool):
    """1024 rows in one launch (0.14 s on the CPU interpreter since its pack and combine
    programs span tokens; it was a slow numerics-only test of its own at 25 s)."""
    check_large_batch(impl, device, pool, 1024)
