"""The harness's processes share the cores for torch's CPU ops (dcp_a2a.testing.cores): xdist
workers (the plugin's share_cores) and the self-check's mutant runs."""

from __future__ import annotations

import os

import pytest

from dcp_a2a.testing import cores, plugin

pytestmark = pytest.mark.unit


@pytest.fixture
def threads_set(monkeypatch):
    """torch.set_num_threads recorded, not called; 16 cores; OMP_NUM_THREADS restored after
    (setenv first: monkeypatch then restores it even where it was unset)."""
    monkeypatch.setenv(cores.THREADS_ENV, "0")
    seen = []
    monkeypatch.setattr(plugin.torch, "set_num_threads", seen.append)
    monkeypatch.setattr(cores, "available_cores", lambda: 16)
    return seen


@pytest.mark.parametrize("workers,threads", [(8, 2), (2, 8), (16, 1), (32, 1), (1, 16)])
def test_each_worker_gets_its_share_and_passes_it_on(monkeypatch, threads_set, workers,
                                                     threads):
    monkeypatch.delenv(cores.THREADS_ENV)
    plugin.share_cores(workers)
    assert threads_set == [threads]
    assert os.environ[cores.THREADS_ENV] == str(threads)  # for the processes tests start


def test_the_users_thread_count_wins(monkeypatch, threads_set):
    monkeypatch.setenv(cores.THREADS_ENV, "5")
    plugin.share_cores(8)
    assert threads_set == [] and os.environ[cores.THREADS_ENV] == "5"


def test_this_worker_runs_with_its_share():
    """The suite's own xdist workers: at most their share of the cores each."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not workers:
        pytest.skip("not an xdist worker (the README's test command runs -n auto)")
    if os.environ.get(cores.THREADS_ENV) is None:
        pytest.fail("the worker did not set OMP_NUM_THREADS")
    assert torch.get_num_threads() == int(os.environ[cores.THREADS_ENV])


@pytest.mark.parametrize("user_threads,expected", [(None, 4), ("3", None)])
def test_mutant_runs_share_the_cores(monkeypatch, tmp_path, user_threads, expected):
    """--parallel 2 mutant runs of --mutant-jobs 2 workers on 16 cores: 4 threads each (the
    run passes them to its session's environment); the user's OMP_NUM_THREADS wins."""
    from dcp_a2a.testing import selfcheck

    if user_threads is None:
        monkeypatch.delenv(cores.THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(cores.THREADS_ENV, user_threads)
    monkeypatch.setattr(cores, "available_cores", lambda: 16)
    seen = []

    def fake_run_one(spec, kind, threads=None, **kw):
        seen.append((kind, threads))
        return selfcheck.Run(spec, kind, verdict="killed")

    monkeypatch.setattr(selfcheck.cr, "run_one", fake_run_one)  # one conformance run
    monkeypatch.setattr(selfcheck.cr, "preflight", lambda *a: {})
    monkeypatch.setattr(selfcheck.signal, "signal", lambda *a: None)  # this process's handler
    code = selfcheck.main(["--correct", "--mutants", "dcp_a2a.testing.mutants.lse_halves_swapped",
                           "--parallel", "2", "--mutant-jobs", "2", "--workdir", str(tmp_path)])
    assert code == 0 and seen == [("mutant", expected)]
