"""Faults on the pool of ranks: the suite must fail fast and never hang CI.

Each test provokes one fault on a 2-rank pool of its own (short process-group timeout), checks
the error names the rank and carries its traceback or stack, that the failure arrives well
within 30 s, that the old ranks are gone, and that the next task runs on a fresh pool.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from dcp_a2a.testing.rankpool import RankFailure, RankTimeout
from dcp_a2a.testing import tasks as mp_tasks
from dcp_a2a.testing.tasks import new_pool
from tests.multiproc._procs import helper_context, pool_owner
from dcp_a2a.testing.rankpool import pid_alive

pytestmark = pytest.mark.multiproc

FAULT_LIMIT_S = 30.0   # the promise: a failing rank is reported within this
PG_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def fault_pool():
    # CPU ranks on any machine: the faults need no kernel, and forked ranks restart fast
    pool = new_pool(2, device="cpu", pg_timeout=PG_TIMEOUT_S, task_timeout=20.0, grace=1.0)
    yield pool
    pool.close()
    left = [p for p in pool.spawned_pids if pid_alive(p)]
    assert not left, f"rank processes left after close: {left}"


def _wait_gone(pids, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def _assert_recovered(pool, old_pids):
    assert not pool.alive
    assert _wait_gone(old_pids) == [], "the failed pool's ranks are still running"
    starts = pool.starts
    assert pool.run(mp_tasks.all_reduce_sum, 2, 1.5) == [3.0, 3.0]
    assert pool.starts == starts + 1, "the next task did not run on a fresh pool"
    assert set(pool.pids).isdisjoint(old_pids)


def test_raising_rank_reports_its_traceback_and_pool_recovers(fault_pool):
    fault_pool.start()
    old = fault_pool.pids
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as ei:
        fault_pool.run(mp_tasks.raise_on, 1, "deliberate failure on rank 1")
    elapsed = time.monotonic() - t0
    assert elapsed < FAULT_LIMIT_S
    e = ei.value
    assert 1 in e.tracebacks
    assert "Traceback" in e.tracebacks[1] and "raise_on" in e.tracebacks[1]
    assert "ValueError: deliberate failure on rank 1" in str(e)
    # rank 0 was left waiting in the barrier (listed as busy, or failed on the pg timeout)
    assert set(e.tracebacks) | set(e.silent) == {0, 1}
    _assert_recovered(fault_pool, old)


def test_rank_hanging_in_collective_fails_on_the_pg_timeout(fault_pool):
    """Rank 0 enters a barrier rank 1 never joins: gloo's timeout raises on rank 0."""
    fault_pool.start()
    old = fault_pool.pids
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as ei:
        fault_pool.run(mp_tasks.barrier_alone, 0)
    elapsed = time.monotonic() - t0
    assert PG_TIMEOUT_S * 0.9 <= elapsed < FAULT_LIMIT_S
    assert set(ei.value.tracebacks) == {0}
    assert "barrier" in ei.value.tracebacks[0]
    assert "Timed out" in ei.value.tracebacks[0] or "timeout" in ei.value.tracebacks[0].lower()
    _assert_recovered(fault_pool, old)


def test_silent_rank_fails_on_the_watchdog_with_its_stack(fault_pool):
    """Rank 1 stalls outside any collective past the task timeout: the parent's watchdog
    gives up, reports where each silent rank was, and tears the pool down."""
    fault_pool.start()
    old = fault_pool.pids
    t0 = time.monotonic()
    with pytest.raises(RankTimeout) as ei:
        fault_pool.run(mp_tasks.sleep_on, 1, 3600.0, timeout=1.5)
    elapsed = time.monotonic() - t0
    assert 1.5 <= elapsed < FAULT_LIMIT_S
    e = ei.value
    assert e.silent == (1,) and not e.tracebacks
    assert "sleep_on" in e.stacks.get(1, ""), e.stacks
    _assert_recovered(fault_pool, old)


def test_dying_rank_is_reported_with_its_exit_code(fault_pool):
    fault_pool.start()
    old = fault_pool.pids
    with pytest.raises(RankFailure) as ei:
        fault_pool.run(mp_tasks.exit_on, 0, 7)
    assert "exited with code 7" in ei.value.tracebacks[0]
    _assert_recovered(fault_pool, old)


def test_close_leaves_no_rank(fault_pool):
    fault_pool.start()
    pids = fault_pool.pids
    fault_pool.close()
    assert _wait_gone(pids, within=5.0) == []


def test_ranks_exit_when_their_owner_is_killed():
    """The owner dies by SIGKILL (no atexit, no finalizer): its ranks notice and exit. The owner
    is a fork of the fork server (torch already imported); its pool starts a fork server of its
    own, which goes with it."""
    ctx = helper_context()
    ours, theirs = ctx.Pipe()
    owner = ctx.Process(target=pool_owner, args=(theirs, 2), name="pool-owner")
    owner.start()
    theirs.close()
    try:
        try:
            pids = ours.recv() if ours.poll(120) else None
        except EOFError:
            pids = None
        assert pids is not None, f"the owner did not start its pool (exit code {owner.exitcode})"
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        os.kill(owner.pid, signal.SIGKILL)
        owner.join(10)
        assert owner.exitcode == -signal.SIGKILL
    finally:
        if owner.exitcode is None:
            owner.kill()
            owner.join(10)
        ours.close()
    assert _wait_gone(pids, within=10.0) == [], "ranks outlived their SIGKILLed owner"


def test_bad_task_arguments_are_rejected_before_anything_runs(fault_pool):
    with pytest.raises(ValueError, match="per_rank has 1 entries for 2 ranks"):
        fault_pool.run(mp_tasks.all_reduce_sum, per_rank=[(1,)])
    with pytest.raises(TypeError, match="cannot be pickled"):
        fault_pool.run(lambda ctx: None)
    with pytest.raises(ValueError, match="no 3-rank group"):
        fault_pool.run(mp_tasks.all_reduce_sum, 3, 1.0, n=3)


def test_ranks_run_the_implementation_under_test(rank_pool, impl):
    """The ranks load the implementation the suite was started with ($DCP_A2A_IMPL)."""
    got = rank_pool.run(mp_tasks.whoami, n=2)
    assert [g[0] for g in got] == [0, 1]
    assert all(g[2] == impl.spec for g in got)
