"""Fixtures of the numerics tier: the in-process exchange of the implementation under test on
the test device (interpreted Triton on CPU, compiled on CUDA). Inputs are generated on the CPU
(reproducible), moved to the device for the contract calls, and results come back on the CPU."""

from __future__ import annotations

import pytest

from tests.numerics._exchange import Exchange


@pytest.fixture
def exchange(impl, device):
    return Exchange(impl, device)
