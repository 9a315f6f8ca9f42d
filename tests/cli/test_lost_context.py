"""A test that destroys its process's CUDA context (an illegal access in the code under test)
keeps its own verdict, and every other test still runs: under xdist the worker retires and a
fresh one takes its tests; in one process the rest is skipped as not run, and ``dcp-a2a
engines`` runs it in a further session. (dcp_a2a.testing.retire; the loss is declared the way
the plugin declares it on a CUDA machine, so the CPU runs the same path.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_a2a.testing import engines
from dcp_a2a.testing.retire import NOT_RUN

pytestmark = [pytest.mark.unit, pytest.mark.slow]  # an xdist session: seconds

TESTS = '''\
import os
import time

import pytest

from dcp_a2a.testing import retire


# two, so that two workers retire together and their replacements join at once
@pytest.mark.parametrize("k", range(2))
def test_a_loses_the_context(request, k):
    retire.lost(request.node.nodeid)
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


# long enough that the worker replacing the retired one joins while tests are left to hand out
@pytest.mark.parametrize("i", range(10))
def test_b_after(i):
    time.sleep(1.5)
'''


# the first replacement collects slowly, so the second one finishes collecting first (xdist
# then handed tests to the first before it had a collection: KeyError, an internal error)
CONFTEST = '''\
import os
import time


def pytest_collection_modifyitems(config, items):
    if getattr(config, "workerinput", {}).get("workerid") == "gw3":
        time.sleep(3)
'''


def _session(tmp_path: Path, *xdist: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_lost.py").write_text(TESTS)
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "pytest.ini").write_text("[pytest]\n")
    prefix = tmp_path / "report"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "dcp_a2a.testing.plugin",
         "-p", "dcp_a2a.testing.recorder", "--dcp-report", str(prefix), *xdist,
         "test_lost.py"], cwd=suite, env=env, capture_output=True, text=True, timeout=300)
    lines = Path(str(prefix) + ".results.jsonl").read_text().splitlines()
    return proc, [r for r in map(json.loads, lines) if r.get("event") == "test"]


def test_under_xdist_fresh_workers_run_the_rest(tmp_path):
    proc, records = _session(tmp_path, "-n", "3", "--dist", "loadgroup")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log  # the two failures; not an internal error (3)
    ids = [r["nodeid"] for r in records]
    assert len(ids) == len(set(ids)) == 12, log  # one record a test: none for a non-start
    by_id = {r["nodeid"]: r for r in records}
    lost = [by_id.pop(f"test_lost.py::test_a_loses_the_context[{k}]") for k in range(2)]
    for rec in lost:
        assert rec["outcome"] == "failed" and "illegal memory access" in rec["message"], rec
        # the worker that lost its context ran nothing after it
        assert not [r for r in by_id.values()
                    if r["worker"] == rec["worker"] and r["t"] > rec["t"]], records
    assert all(r["outcome"] == "passed" for r in by_id.values()), by_id
    # (whether the replacements join while tests are left is up to the machine's load; when
    # they do, a hang of theirs shows as this session's timeout)


def test_in_one_process_the_rest_is_not_run(tmp_path):
    proc, records = _session(tmp_path, "-p", "no:xdist")
    by_id = {r["nodeid"]: r for r in records}
    assert by_id.pop("test_lost.py::test_a_loses_the_context[0]")["outcome"] == "failed"
    assert len(by_id) == 11 and all(
        r["outcome"] == "skipped" and r["text"].startswith(NOT_RUN) for r in by_id.values()), \
        proc.stdout


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
