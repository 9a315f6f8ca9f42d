"""Batch invariance at 1024 rows (numerics tier, slow).

Kept out of the conformance tier's 60-s budget: on the CPU interpreter the 1024-row launch costs
~25 s (one program per row). Same check as test_determinism's 128-row case.
"""

from __future__ import annotations

import pytest

from tests.numerics.test_determinism import POOL, pool  # noqa: F401
from tests.numerics.test_determinism import test_batch_invariance_large_batch as _check

pytestmark = [pytest.mark.numerics, pytest.mark.slow]


def test_batch_invariance_1024_rows(impl, device, pool):  # noqa: F811
    _check(impl, device, pool, POOL)
