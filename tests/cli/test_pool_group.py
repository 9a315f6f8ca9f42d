"""Under xdist (``-n 2 --dist loadgroup``, as validate and the self-check run pytest), the tests
on the pool of ranks run on one worker, before anything else there: one pool, started at once.
With pytest 9.2 and xdist 3.8 the group mark alone no longer did it (dcp_a2a.testing.poolgroup):
every worker started a pool of its own."""

from __future__ import annotations

import os

import pytest

from ._fake_suite import run_with_plugin

pytestmark = [pytest.mark.unit, pytest.mark.slow]  # an xdist session: seconds

CONFTEST = '''\
import os
from pathlib import Path

import pytest

LOG = Path(os.environ["POOL_GROUP_LOG"])


@pytest.fixture(scope="session")
def rank_pool():  # stands in for the plugin's (no ranks started)
    return "pool"


@pytest.fixture
def log_worker(request):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "none")
    with open(LOG / worker, "a") as fh:
        fh.write(request.node.name + "\\n")
'''

TESTS = '''\
import time

import pytest


@pytest.mark.parametrize("i", range(6))
def test_plain(log_worker, i):
    time.sleep(0.3)


@pytest.mark.parametrize("i", range(4))
def test_on_the_pool(log_worker, rank_pool, i):
    time.sleep(0.1)


@pytest.mark.parametrize("i", range(6))
def test_plain_too(log_worker, i):
    time.sleep(0.3)
'''


def test_the_pool_tests_share_one_worker_and_start_first(tmp_path):
    suite, log = tmp_path / "suite", tmp_path / "log"
    suite.mkdir()
    log.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_pool.py").write_text(TESTS)
    (suite / "pytest.ini").write_text("[pytest]\n")
    proc = run_with_plugin(suite, "-q", "-n", "2", "--dist", "loadgroup", "test_pool.py",
                           env=dict(os.environ, POOL_GROUP_LOG=str(log)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = {p.name: p.read_text().split() for p in log.iterdir()}
    pooled = {w: [t for t in tests if t.startswith("test_on_the_pool")]
              for w, tests in ran.items()}
    holders = [w for w, tests in pooled.items() if tests]
    assert len(holders) == 1 and len(pooled[holders[0]]) == 4, ran
    assert set(ran) == {"gw0", "gw1"}, ran  # the rest was spread
    first = ran[holders[0]][:4]
    assert all(t.startswith("test_on_the_pool") for t in first), ran
