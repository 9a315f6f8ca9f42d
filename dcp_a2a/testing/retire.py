"""A pytest-xdist worker whose CUDA context is lost retires, and a fresh one takes its tests.

An illegal access in the code under test poisons the process's CUDA context: every later CUDA
call in that process fails with the same error. On one H100 (2026-12-07) vLLM 0.34.0's pack over
a batch without requests did that in one of three workers, which then skipped its way through
367 of the 468 conformance tests in a second: the engine's verdict rested on a fifth of the
contract. So the test that lost the context keeps its own verdict (memory unsafety, with its
error and reproducer), and its worker ends before the next test starts. xdist hands the
worker's unstarted tests to the other workers and to the one it starts in its place (up to
``--max-worker-restart``; past that the session ends and its unstarted tests count as not run).

xdist reports a worker that ends as a crash of the test it was handed next, which had not
started. The worker leaves a note (``$DCP_A2A_RETIRED_DIR/<worker>.json``) before it ends; the
controller reads it, and the report of that test says "not run yet" (a skip the recorder keeps no
record of: the test runs again on another worker and gets its own).

In one process (no xdist) there is no worker to replace: every later test is skipped as not
run (:data:`NOT_RUN`), and ``dcp-a2a engines`` runs those in a further session.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ENV = "DCP_A2A_RETIRED_DIR"
NOT_RUN = "not run: this process lost its CUDA context to memory unsafety in "
# set on xdist's report of the test a retired worker was handed next: it had not started
RETIRED = "dcp_a2a_retired"
EXIT_STATUS = 75  # what the retired worker ends with (EX_TEMPFAIL): xdist only sees it end

_lost_in: list[str] = []


def lost(nodeid: str) -> None:
    """The test ``nodeid`` left this process's CUDA context unusable."""
    _lost_in.append(nodeid)


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    """Controller of an xdist session: a fresh directory for the workers' notes, inherited by
    them through the environment; elsewhere none, so a nested session never reads an outer
    one's."""
    if _is_worker(config):
        return
    if getattr(config.option, "numprocesses", None):
        where = tempfile.mkdtemp(prefix="dcp_a2a_retired_")
        os.environ[ENV] = where
        config.add_cleanup(lambda: shutil.rmtree(where, ignore_errors=True))
    else:
        os.environ.pop(ENV, None)


def _notes() -> Path | None:
    where = os.environ.get(ENV)
    return Path(where) if where and Path(where).is_dir() else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """An xdist worker whose context is lost ends here, before the test it was handed next
    starts (the one that lost it has completed and reported)."""
    notes = _notes()
    if not _lost_in or not _is_worker(item.config) or notes is None:
        return None
    worker = item.config.workerinput.get("workerid", "gw")
    tmp = notes / f".{worker}.json.tmp"
    tmp.write_text(json.dumps({"lost_in": _lost_in[0]}))
    tmp.replace(notes / f"{worker}.json")
    from .rankpool import _close_all_pools

    _close_all_pools()  # the ranks would follow within a second anyway (they watch their owner)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STATUS)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """One process, no worker to replace: what is left is not run here."""
    if _lost_in:
        pytest.skip(NOT_RUN + _lost_in[0])


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """Controller: xdist's crash report for the test a retired worker was handed next says
    what happened to it instead (and is marked :data:`RETIRED`)."""
    notes = _notes()
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    note = notes / f"{worker}.json" if notes is not None and worker else None
    if note is None or not note.is_file():
        return  # a real crash
    lost_in = json.loads(note.read_text())["lost_in"]
    note.unlink()
    report.outcome = "skipped"
    report.longrepr = (crashitem.split("::")[0], None,
                       f"Skipped: not run yet: worker {worker} retired after losing its CUDA "
                       f"context to memory unsafety in {lost_in}; another worker runs it")
    setattr(report, RETIRED, True)
