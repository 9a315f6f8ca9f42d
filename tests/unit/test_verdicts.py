"""How bad a failure is (dcp_a2a.testing.verdicts): severities from the exception a test raised
or a rank's traceback, and the clause table a summary shows."""

from __future__ import annotations

import pytest

from dcp_a2a.testing.verdicts import (IMPL_RAISED, Convention, Defect, Precision, by_severity,
                                      clause_table, severity_of, severity_of_tracebacks,
                                      severity_of_text)

pytestmark = pytest.mark.unit


def _tagged(e):
    setattr(e, IMPL_RAISED, True)
    return e


@pytest.mark.parametrize("exc,want", [
    (AssertionError("3 of 8 elements over the bound"), ("defect", "wrong result")),
    (Defect("modified the caller's out"), ("defect", "defect")),
    (Convention("refused with RuntimeError"), ("convention", "convention")),
    (Precision("1.4x the bound"), ("precision", "precision")),
    (_tagged(RuntimeError("arange's range must be a power of 2")),
     ("limitation", "valid input refused (RuntimeError)")),
    (_tagged(AssertionError("engine assert")), ("limitation", "valid input refused "
                                                              "(AssertionError)")),
    (RuntimeError("CUDA error: an illegal memory access was encountered"),
     ("defect", "memory unsafety")),
    (KeyError("x"), ("defect", "unexpected KeyError")),
    (RuntimeError("CUDA error: device-side assert triggered"), ("defect", "memory unsafety")),
    # torch's host-side bounds check raised before any memory was read: a loud refusal
    (_tagged(IndexError("index is out of bounds for dimension with size 0")),
     ("limitation", "valid input refused (IndexError)")),
    (RuntimeError("Invalid __global__ read of size 4: address is out of bounds"),
     ("defect", "memory unsafety")),
], ids=["assert", "defect", "convention", "precision", "refusal", "engine_assert", "illegal",
        "harness", "device_assert", "bounds_checked", "sanitizer"])
def test_severity_of_an_exception(exc, want):
    assert severity_of(exc) == want


def test_severity_of_ranks_tracebacks_is_the_worst():
    conv = ('Traceback (most recent call last):\n  File "/x/dcp_a2a/testing/tasks.py", line 3\n'
            'dcp_a2a.testing.verdicts.Convention: refused with RuntimeError')
    wrong = ('Traceback (most recent call last):\n  File "/x/dcp_a2a/testing/groups.py", line 9\n'
             'AssertionError: rank 1: 4 of 8 elements over the bound')
    engine = ('Traceback (most recent call last):\n  File "/x/vllm_dcp.py", line 40\n'
              'RuntimeError: bad arange')
    assert severity_of_tracebacks([conv]) == ("convention", "convention")
    assert severity_of_tracebacks([conv, wrong]) == ("defect", "wrong result")
    assert severity_of_tracebacks([engine])[0] == "limitation"
    assert severity_of_text("the pytest process died while this test ran")[1] == \
        "memory unsafety"


def test_failures_come_worst_first_and_clauses_count_what_was_judged():
    recs = [
        {"nodeid": "a", "clause": "bad input", "outcome": "failed",
         "severity": {"severity": "convention", "why": "convention"}},
        {"nodeid": "b", "clause": "masking", "outcome": "failed",
         "severity": {"severity": "defect", "why": "wrong result"}},
        {"nodeid": "c", "clause": "masking", "outcome": "passed"},
        {"nodeid": "d", "clause": "exchange", "outcome": "skipped",
         "text": "not applicable: exchange (implementation x does not expose it)"},
        {"nodeid": "e", "clause": "merge bound", "outcome": "skipped",
         "text": "outside the envelope: head dim 24 (head dims: power of two only)"},
        {"nodeid": "f", "clause": "envelope", "outcome": "skipped",
         "text": "envelope limit: head dim 3: refused (CompilationError: ...)"},
        {"nodeid": "g", "clause": "merge bound", "outcome": "passed", "uses_impl": False},
    ]
    assert [f["nodeid"] for f in by_severity([r for r in recs if r["outcome"] == "failed"])] \
        == ["b", "a"]
    rows = {r["clause"]: r for r in clause_table(recs, ["merge bound", "masking", "exchange",
                                                         "bad input", "envelope"])}
    assert rows["masking"]["judged"] == 2 and rows["masking"]["failed"]["defect"] == 1
    assert rows["exchange"]["not_applicable"] == 1 and rows["exchange"]["judged"] == 0
    assert rows["exchange"]["not_applicable_why"] == ["exchange"]
    assert rows["merge bound"]["outside"] == 1 and rows["merge bound"]["passed"] == 0
    assert rows["envelope"]["limits"] == ["head dim 3: refused (CompilationError: ...)"]
    assert rows["bad input"]["failed"]["convention"] == 1


def test_defects_from_valid_input_come_before_defects_from_bad_input():
    """What valid input does leads (a crash, then wrong numbers); then what bad input does: a
    crash before bad input merely let through. An engine's column opens with the defects that
    hit correct callers."""
    def rec(nodeid, clause, why):
        return {"nodeid": nodeid, "clause": clause, "outcome": "failed",
                "severity": {"severity": "defect", "why": why}}

    recs = [rec("let_through", "bad input", "garbage accepted"),
            rec("crash_on_bad_into", "bad input", "memory unsafety (the worker process died)"),
            rec("strided_index", "masking", "wrong result"),
            rec("empty_seq_lens", "masking", "memory unsafety (the worker process died)"),
            rec("refusal_elsewhere", "caller buffer", "garbage accepted"),
            {"nodeid": "weaker", "clause": "merge bound", "outcome": "failed",
             "severity": {"severity": "precision", "why": "precision"}}]
    assert [f["nodeid"] for f in by_severity(recs)] == [
        "empty_seq_lens", "strided_index", "crash_on_bad_into", "let_through",
        "refusal_elsewhere", "weaker"]
