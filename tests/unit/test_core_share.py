"""xdist workers share the cores for torch's CPU ops (dcp_a2a.testing.plugin.share_cores)."""

from __future__ import annotations

import os

import pytest

from dcp_a2a.testing import plugin

pytestmark = pytest.mark.unit


@pytest.fixture
def threads_set(monkeypatch):
    seen = []
    monkeypatch.setattr(plugin.torch, "set_num_threads", seen.append)
    monkeypatch.setattr(plugin.os, "sched_getaffinity", lambda pid: set(range(16)),
                        raising=False)
    return seen


@pytest.mark.parametrize("workers,threads", [(8, 2), (2, 8), (16, 1), (32, 1), (1, 16)])
def test_each_worker_gets_its_share_and_passes_it_on(monkeypatch, threads_set, workers,
                                                     threads):
    monkeypatch.delenv(plugin.THREADS_ENV, raising=False)
    plugin.share_cores(workers)
    assert threads_set == [threads]
    assert os.environ[plugin.THREADS_ENV] == str(threads)  # for the processes tests start


def test_the_users_thread_count_wins(monkeypatch, threads_set):
    monkeypatch.setenv(plugin.THREADS_ENV, "5")
    plugin.share_cores(8)
    assert threads_set == [] and os.environ[plugin.THREADS_ENV] == "5"


def test_this_worker_runs_with_its_share():
    """The suite's own xdist workers: at most their share of the cores each."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not workers:
        pytest.skip("not an xdist worker (the README's test command runs -n auto)")
    if os.environ.get(plugin.THREADS_ENV) is None:
        pytest.fail("the worker did not set OMP_NUM_THREADS")
    assert torch.get_num_threads() == int(os.environ[plugin.THREADS_ENV])
