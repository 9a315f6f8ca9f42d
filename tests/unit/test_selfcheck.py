"""CI: the self-check. Every shipped mutant is killed by the conformance tier and the correct
implementations pass it (``python -m dcp_a2a.testing.selfcheck``); and the self-check itself fails
when a mutant survives.

Not marked ``conformance``: these tests run the conformance tier in subprocesses (a test that
did so from inside the tier would recurse).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dcp_a2a.testing.conformance_run import needs_gpus
from dcp_a2a.testing.devices import gpu_count
from dcp_a2a.testing.selfcheck import FOREIGN_CORRECT, discover_mutants

pytestmark = pytest.mark.selfcheck

ROOT = Path(__file__).resolve().parents[2]


def _selfcheck(tmp_path, *args, timeout):
    out = tmp_path / "selfcheck.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcp_a2a.testing.selfcheck", "--json", str(out),
         "--workdir", str(tmp_path / "runs"), *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the self-check ends the pytest sessions it started
        stdout, stderr = proc.communicate(timeout=60)
        raise AssertionError(f"selfcheck did not finish in {timeout} s:\n{stdout[-4000:]}")
    report = json.loads(out.read_text()) if out.exists() else None
    return SimpleNamespace(returncode=proc.returncode, stdout=stdout, stderr=stderr), report


def test_corpus_has_a_dozen_described_mutants():
    mutants = discover_mutants(ROOT)
    assert len(mutants) >= 12, [m for m, _ in mutants]
    for spec, desc in mutants:
        assert ":" in desc and len(desc) > 30, f"{spec}: its first docstring line must name " \
                                               f"the failure class, got {desc!r}"


def test_a_selfcheck_that_checks_nothing_is_not_a_pass(tmp_path):
    """No correct implementation and no mutant (or only mutants this machine cannot run) said
    "0/0 mutants killed" and exited 0; now exit status 5 and ``ok`` false."""
    proc, report = _selfcheck(tmp_path, "--correct", "--no-mutants", timeout=120)
    assert proc.returncode == 5 and "nothing checked" in proc.stdout, proc.stdout + proc.stderr
    assert report["runs"] == [] and report["ok"] is False
    if gpu_count() == 0:  # a GPU-only mutant alone: not run here, so nothing checked
        proc, report = _selfcheck(tmp_path, "--correct", "--only", "graph_buffer_regrows",
                                  timeout=120)
        assert proc.returncode == 5 and report["runs"][0]["verdict"] == "not run", proc.stdout


PAIR = ("dcp_a2a.reference.contract", "dcp_a2a.testing.mutants.lse_halves_swapped")


@pytest.mark.parametrize("how,verdicts", [
    # judged as mutants: the correct one survives (the self-check fails and says which), the
    # real mutant is killed
    (("--correct", "--mutants", *PAIR), ("SURVIVED", "killed")),
    # judged as correct implementations, two at once (as gpu-check runs its two): each on its
    # own records, the broken one failing beside the one that passes
    (("--correct", *PAIR, "--no-mutants", "--correct-parallel", "2", "--jobs", "1"),
     ("pass", "FAIL")),
], ids=["as_mutants", "as_correct_at_once"])
def test_the_selfcheck_fails_on_a_wrong_verdict_and_says_which(tmp_path, how, verdicts):
    proc, report = _selfcheck(
        tmp_path, *how, "--paths", "dcp_a2a/testing/conformance/test_wire_format.py",
        timeout=600)
    assert report is not None, proc.stdout + proc.stderr
    got = {r["spec"]: r["verdict"] for r in report["runs"]}
    assert got == dict(zip(PAIR, verdicts)), proc.stdout
    assert proc.returncode == 1 and not report["ok"]
    wrong = [spec for spec, v in got.items() if v in ("SURVIVED", "FAIL")]
    assert wrong and all(f"PROBLEM {spec}: " in proc.stdout for spec in wrong)


def test_every_mutant_killed_and_correct_implementations_pass(tmp_path):
    """Every mutant killed; the reference contract passes, and so do the implementation that
    takes every freedom the contract leaves and the one written from scratch (a test that fails
    them fails correct engines). (The
    project's own implementation
    passes the same conformance tier in this very test session, with the default --impl, so
    the self-check does not run it a second time here; ``python -m dcp_a2a.testing.selfcheck``
    runs both.)"""
    # --jobs 1: the reference contract's run is forked from the preloaded server too (xdist
    # workers would each import torch again, on a CI machine whose cores run the suite already)
    proc, report = _selfcheck(tmp_path, "--correct", *FOREIGN_CORRECT, "--jobs", "1",
                              timeout=2400)
    print(proc.stdout)  # the kill table, in the CI log
    assert report is not None, proc.stdout[-4000:] + proc.stderr[-4000:]
    runs = report["runs"]
    correct = {r["spec"]: r for r in runs if r["kind"] == "correct"}
    assert set(correct) == {"dcp_a2a.reference.contract", "dcp_a2a.testing.freedoms",
                            "dcp_a2a.testing.independent"}
    for spec, r in correct.items():
        assert r["verdict"] == "pass" and r["passed"] > 0, \
            f"{spec}: {r['verdict']}, first failure {r['first_failure']}: {r['failure_text']}"
    mutants = [r for r in runs if r["kind"] == "mutant"]
    assert len(mutants) == len(discover_mutants(ROOT))
    gpus = gpu_count()
    # a mutant whose bug shows only under CUDA graphs is judged where there are GPUs
    survivors = [f"{r['spec']} ({r['verdict']}: {'; '.join(r['notes'])})" for r in mutants
                 if not (r["verdict"] == "killed" or (r["verdict"] == "not run"
                                                       and needs_gpus(r["spec"]) > gpus))]
    assert not survivors, "not killed: " + ", ".join(survivors) + "\n" + proc.stdout[-4000:]
    assert proc.returncode == 0 and report["ok"]


def test_a_mutant_that_kills_the_process_is_killed_not_unjudged(tmp_path):
    """The records of a session that died in a test (a start event, no result, no session
    record) count that test as the mutant's first failure; the self-check's own timeout does
    not (a hang is not judged a kill)."""
    from dcp_a2a.testing.conformance_run import Run, _read_results

    path = tmp_path / "m.results.jsonl"
    node = "dcp_a2a/testing/conformance/test_args.py::test_x"
    path.write_text("".join(json.dumps(e) + "\n" for e in (
        {"event": "start", "nodeid": "a::ok"},
        {"event": "test", "nodeid": "a::ok", "outcome": "passed", "phase": "call"},
        {"event": "start", "nodeid": node})))
    died = Run("m", "mutant", log="m.log")
    _read_results(path, died, returncode=-11)
    assert (died.passed, died.failed, died.first_failure) == (1, 1, node)
    assert "died while this test ran (exit status -11)" in died.failure_text_full
    hung = Run("m", "mutant", log="m.log")
    _read_results(path, hung, returncode=None, timed_out=True)
    assert (hung.passed, hung.failed) == (1, 0)


def test_a_suspect_given_as_a_file_is_judged_as_its_module(tmp_path, monkeypatch, capsys):
    """``--mutants path/to/suspect.py``: the pytest sessions run in the checkout, so the file
    becomes its module (its directory on sys.path and PYTHONPATH) before anything starts."""
    from dcp_a2a.testing import selfcheck

    (tmp_path / "my_suspect.py").write_text('"""Suspect: what it breaks."""\n')
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.chdir(ROOT)
    assert selfcheck.main(["--mutants", str(tmp_path / "my_suspect.py"), "--list"]) == 0
    assert capsys.readouterr().out.split() == ["my_suspect", "Suspect:", "what", "it", "breaks."]
    assert selfcheck.main(["--mutants", str(tmp_path / "absent.py"), "--list"]) == 2
    assert "implementation file" in capsys.readouterr().err
