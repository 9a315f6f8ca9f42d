"""Batch invariance at 1024 rows (numerics tier, slow).

Kept out of the conformance tier's time budget: on the CPU interpreter the 1024-row launch costs
~25 s (one program per row). Same check as test_determinism's 64-row case.
"""

from __future__ import annotations

import pytest

from dcp_a2a.testing.conformance.numerics._batch import check_large_batch, pool  # noqa: F401

pytestmark = [pytest.mark.numerics, pytest.mark.slow, pytest.mark.clause("merge bound")]


def test_batch_invariance_1024_rows(impl, device, pool):  # noqa: F811
    check_large_batch(impl, device, pool, 1024)
