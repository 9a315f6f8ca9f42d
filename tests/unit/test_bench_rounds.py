"""The benchmark's interleaved timing rounds (host logic only: a fake timer stands in for the
GPU's)."""

from __future__ import annotations

import pytest

from dcp_a2a.testing.bench import timed_rounds

pytestmark = pytest.mark.unit


def test_rounds_interleave_the_variants_and_report_medians():
    calls = []
    times = {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 9.0, 4.0])}

    def timer(fn, nbytes):
        name = fn()
        calls.append((name, nbytes))
        return next(times[name]), "graph"

    med, rounds, method = timed_rounds({"a": lambda: "a", "b": lambda: "b"}, 64, 3, timer)
    assert calls == [("a", 64), ("b", 64)] * 3  # one of each a round, not three of a then b
    assert med == {"a": 3.0, "b": 4.0} and rounds == {"a": [5.0, 1.0, 3.0], "b": [2.0, 9.0, 4.0]}
    assert method == "graph"
