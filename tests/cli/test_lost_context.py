"""A test that destroys its process's CUDA context (an illegal access in the code under test)
keeps its own verdict, and the tests after it in that process are not run, never judged;
``dcp-a2a engines`` runs them in a further session (dcp_a2a.testing.lostcontext: the loss is
declared the way the plugin declares it on a CUDA machine, so the CPU runs the same path). And a
test that kills its worker outright (an engine's segfault) is its worker's only casualty: xdist
replaces the worker, the crashed test runs once, the others all run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dcp_a2a.testing import engines
from dcp_a2a.testing.lostcontext import NOT_RUN

from ._fake_suite import run_with_plugin

pytestmark = [pytest.mark.unit, pytest.mark.slow]  # xdist sessions: seconds

LOSES = '''\
import time

import pytest

from dcp_a2a.testing import lostcontext


def test_a_loses_the_context(request):
    lostcontext.lost(request.node.nodeid)
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("i", range(10))
def test_b_after(i):
    time.sleep(0.2)
'''

CRASHES = '''\
import os
import time

import pytest


# two, so that two workers die together and their replacements join at once
@pytest.mark.parametrize("k", range(2))
def test_a_kills_its_worker(k):
    os._exit(11)


@pytest.mark.parametrize("i", range(10))
def test_b_after(i):
    time.sleep(1.0)
'''

# the first replacement collects slowly, so the second one finishes collecting first (xdist
# then handed tests to the first before it had a collection: KeyError, an internal error)
CONFTEST = '''\
import time


def pytest_collection_modifyitems(config, items):
    if getattr(config, "workerinput", {}).get("workerid") == "gw3":
        time.sleep(3)
'''


def _session(tmp_path: Path, tests: str, *xdist: str
             ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_it.py").write_text(tests)
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "pytest.ini").write_text("[pytest]\n")
    prefix = tmp_path / "report"
    proc = run_with_plugin(suite, "-p", "dcp_a2a.testing.recorder", "--dcp-report", str(prefix),
                           *xdist, "test_it.py")
    lines = Path(str(prefix) + ".results.jsonl").read_text().splitlines()
    return proc, [r for r in map(json.loads, lines) if r.get("event") == "test"]


def test_in_one_process_the_rest_is_not_run(tmp_path):
    proc, records = _session(tmp_path, LOSES, "-p", "no:xdist")
    by_id = {r["nodeid"]: r for r in records}
    lost = by_id.pop("test_it.py::test_a_loses_the_context")
    assert lost["outcome"] == "failed" and "illegal memory access" in lost["message"], lost
    assert len(by_id) == 10 and all(
        r["outcome"] == "skipped" and r["text"].startswith(NOT_RUN) for r in by_id.values()), \
        proc.stdout


def test_under_xdist_the_other_workers_go_on(tmp_path):
    proc, records = _session(tmp_path, LOSES, "-n", "2", "--dist", "loadgroup")
    by_id = {r["nodeid"]: r for r in records}
    assert len(records) == len(by_id) == 11, proc.stdout
    lost = by_id.pop("test_it.py::test_a_loses_the_context")
    for r in by_id.values():
        after_on_that_worker = r["worker"] == lost["worker"] and r["t"] > lost["t"]
        assert (r["outcome"], r["text"].startswith(NOT_RUN)) == (
            ("skipped", True) if after_on_that_worker else ("passed", False)), r


def test_crashed_workers_are_replaced_and_their_tests_run_once(tmp_path):
    proc, records = _session(tmp_path, CRASHES, "-n", "3", "--dist", "loadgroup")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log  # the two crashes; not an internal error (3)
    ids = [r["nodeid"] for r in records]
    assert len(ids) == len(set(ids)) == 12, log  # the crashed tests are not run again
    by_id = {r["nodeid"]: r for r in records}
    for k in range(2):
        crash = by_id.pop(f"test_it.py::test_a_kills_its_worker[{k}]")
        assert crash["outcome"] == "failed" and crash["phase"] == "crash", crash
    assert all(r["outcome"] == "passed" for r in by_id.values()), by_id


def test_engines_run_what_a_lost_context_left_in_a_further_session(tmp_path, monkeypatch):
    """Session 0 loses its context after one test and skips the rest as not run; session 1
    (which must not be told to leave them out) runs them."""
    names = ["t::lost", "t::b", "t::c"]
    sessions = []

    def fake_validate(cmd, stdout, stderr):
        out = Path(cmd[cmd.index("--out") + 1])
        done = set(Path(cmd[cmd.index("--dcp-deselect") + 1]).read_text().split())
        sessions.append(done)
        if not done:
            tests = [{"nodeid": "t::lost", "outcome": "failed", "text": "illegal access"}] + [
                {"nodeid": n, "outcome": "skipped", "text": NOT_RUN + "t::lost"}
                for n in names[1:]]
        else:
            tests = [{"nodeid": n, "outcome": "passed", "text": ""}
                     for n in names if n not in done]
        for t in tests:
            t.update(tiers=["conformance"], clause="merge bound")
        out.mkdir(parents=True)
        (out / "validation.json").write_text(json.dumps({"tests": tests, "tiers": []}))
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(engines, "_probe", lambda spec: (
        {"described": spec, "surfaces": ["merge"], "envelope": "", "spec": spec}, None))
    monkeypatch.setattr(engines.subprocess, "run", fake_validate)
    run = engines.run_engine("stand-in", tmp_path, "conformance", "1")
    assert sessions == [set(), {"t::lost"}]
    assert run.sessions == 2 and run.tests == 3
    assert run.clauses["merge bound"]["passed"] == 2, run.clauses
