"""Unit tier: what the reference contract holds when it runs under CUDA graph capture. (Whether
that makes it safe is judged on a GPU: the conformance tier's graphs clause, which the
self-check runs for the contract.) Capture is simulated here, so the CPU checks the holding."""

from __future__ import annotations

import torch
import pytest

from dcp_a2a import Group
from dcp_a2a.reference import contract
from dcp_a2a.testing.data import partials

pytestmark = pytest.mark.unit


def test_under_capture_every_tensor_a_call_creates_is_held(monkeypatch):
    impl = contract.ReferenceContract()
    outs, lses = partials(1, 3, 4, 8, torch.bfloat16, seed=5)
    monkeypatch.setattr(contract, "_capturing", lambda: False)
    impl.lse_reduce(outs[0], lses[0], Group(1, 0, None), return_lse=True)
    assert impl.held_for_graphs == []  # eager calls hold nothing

    monkeypatch.setattr(contract, "_capturing", lambda: True)
    out, lse = impl.lse_reduce(outs[0], lses[0], Group(1, 0, None), return_lse=True)
    held = impl.held_for_graphs
    assert {id(out), id(lse)} <= {id(t) for t in held}
    # intermediates, not only the results: the wire buffer and the float64 weighted sum
    assert any(t.shape == (1, 3, 4, 10) and t.dtype == torch.bfloat16 for t in held)
    assert any(t.shape == (3, 4, 8) and t.dtype == torch.float64 for t in held)
    # what one call holds does not depend on the calls before it
    per_call = len(held)
    impl.lse_reduce(outs[0], lses[0], Group(1, 0, None), return_lse=True)
    assert len(held) == 2 * per_call
