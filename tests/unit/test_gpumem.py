"""The GPU memory shares of the test processes on one card (dcp_a2a.testing.gpumem):
* a share that does not fit next to the others waits for them; one that fits does not wait;
  one larger than the budget runs alone;
* a dead process's share is dropped;
* a share is given back even when the test and CUDA both fail;
* a test that reserved more than it asked for gets a warning.
No GPU is needed: where the code calls torch.cuda, these tests stand in for it. Real processes
hold the shares, since a share belongs to a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from dcp_a2a.testing import gpumem

pytestmark = pytest.mark.unit

# asks for a share of argv[2] bytes (limit argv[3]) and holds it until the file argv[4] exists
# (or the test is gone: no holder outlives it; no clock, which a loaded machine would run out);
# prints when it asked, got and gave it
_HOLDER = r"""
import os, sys, time
from pathlib import Path
from dcp_a2a.testing import gpumem
path, n, limit, stop = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
test = os.getppid()
print("asking", time.time(), flush=True)
gpumem.acquire(n, limit, path)
print("got", time.time(), flush=True)
while not stop.exists() and os.getppid() == test:
    time.sleep(0.02)
print("gave", time.time(), flush=True)
gpumem.release(n, path)
"""
# how long a step may take before the test gives up on it: long, since only a broken share
# (never a slow machine) should reach it; a passing run takes a few seconds
PATIENCE_S = 300


def _start(path, n, limit, stop):
    """A holder process, once it has asked for its share."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), str(n), str(limit),
                             str(stop)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("asking")
    return proc


def _times(proc):
    """When the holder got and gave its share. Its output is read through the same buffered
    stream ``_start`` read its first line from: ``communicate(timeout=...)`` reads the pipe's
    file descriptor itself and never sees what that ``readline`` had already buffered -- the
    "got" line, whenever the holder printed it before the test read "asking" (a loaded machine:
    KeyError 'got')."""
    proc.wait(timeout=PATIENCE_S)
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    t = dict(line.split() for line in out.splitlines())
    return float(t["got"]), float(t["gave"])


def _held(path):
    """The shares held, read under the holders' lock (a holder rewrites the file in place: a
    read without the lock can see it empty, as one on the loaded CI machine once did)."""
    from filelock import FileLock

    with FileLock(str(path) + ".lock"):
        try:
            return sorted(json.loads(path.read_text()).values())
        except FileNotFoundError:
            return []


def _wait_until(predicate, what):
    deadline = time.time() + PATIENCE_S
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(what)


def test_a_share_that_does_not_fit_waits_and_one_that_fits_does_not(tmp_path):
    path, hold, go = tmp_path / "shares.json", tmp_path / "hold", tmp_path / "go"
    go.touch()
    first = _start(path, 6, 10, hold)
    _wait_until(lambda: _held(path) == [6], "the first share was never taken")
    too_big = _start(path, 6, 10, go)     # 6 + 6 > 10: after the first gives its share back
    fits = _start(path, 3, 10, go)        # 6 + 3 <= 10: at once
    _times(fits)                          # got and gave while the first holds its share
    assert first.poll() is None
    time.sleep(4 * gpumem.POLL_S)         # several of too_big's tries
    assert _held(path) == [6] and too_big.poll() is None
    hold.touch()
    _, first_gave = _times(first)
    big_got, _ = _times(too_big)
    assert big_got >= first_gave, (big_got, first_gave)
    assert _held(path) == []              # every share given back


def test_a_holder_is_read_whole_however_late_the_test_reads_it(tmp_path):
    """The test process descheduled until a holder has printed all it prints (what a loaded
    2-core machine does at random): its first line is read, then the rest, none lost (reading
    the rest with ``communicate(timeout=...)`` lost the lines the first ``readline`` had
    buffered: KeyError 'got' in CI)."""
    path, go = tmp_path / "shares.json", tmp_path / "go"
    go.touch()
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), "3", "10", str(go)],
                            stdout=subprocess.PIPE, text=True)
    proc.wait(timeout=PATIENCE_S)
    assert proc.stdout.readline().startswith("asking")
    got, gave = _times(proc)
    assert got <= gave and _held(path) == []


def test_a_share_larger_than_the_budget_runs_alone(tmp_path):
    path, hold, go = tmp_path / "shares.json", tmp_path / "hold", tmp_path / "go"
    go.touch()
    small = _start(path, 1, 10, hold)
    _wait_until(lambda: _held(path) == [1], "the small share was never taken")
    huge = _start(path, 50, 10, go)
    time.sleep(4 * gpumem.POLL_S)
    assert _held(path) == [1] and huge.poll() is None
    hold.touch()
    _, small_gave = _times(small)
    huge_got, _ = _times(huge)
    assert huge_got >= small_gave


def test_a_dead_process_share_is_dropped(tmp_path):
    path = tmp_path / "shares.json"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    path.write_text(json.dumps({dead.stdout.strip(): 10}))  # a worker that died holding 10
    waited = gpumem.acquire(8, 10, path, wait_limit_s=30)
    assert waited < 5
    assert json.loads(path.read_text()) == {str(os.getpid()): 8}
    gpumem.release(8, path)
    assert json.loads(path.read_text()) == {}


def test_without_cuda_a_share_is_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with gpumem.gpu_memory_share(1 << 40):
        pass
    assert not list(tmp_path.glob("dcp_a2a_gpu_shares_*"))


class _FakeCuda:
    """torch.cuda as gpu_memory_share sees it: an 80 GiB card whose allocator reports
    ``peak`` bytes reserved at the test's peak, and whose ``synchronize`` can fail (as it does
    after a CUDA error)."""

    def __init__(self, monkeypatch, tmp_path, peak=0, sync_fails=False):
        import types

        import torch

        props = types.SimpleNamespace(total_memory=80 * gpumem.GIB, uuid="GPU-test")
        self.emptied = 0
        monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
        for name, fn in {
            "is_available": lambda: True,
            "get_device_properties": lambda *a: props,
            "memory_reserved": lambda *a: 0,
            "max_memory_reserved": lambda *a: peak,
            "reset_peak_memory_stats": lambda *a: None,
            "empty_cache": self._empty,
            "synchronize": (self._fail if sync_fails else lambda *a: None),
        }.items():
            monkeypatch.setattr(torch.cuda, name, fn)

    def _empty(self):
        self.emptied += 1

    @staticmethod
    def _fail(*a):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def _shares(tmp_path):
    return json.loads((tmp_path / "dcp_a2a_gpu_shares_GPU-test.json").read_text())


def test_the_share_is_given_back_when_the_test_and_cuda_fail(tmp_path, monkeypatch):
    _FakeCuda(monkeypatch, tmp_path, sync_fails=True)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        with gpumem.gpu_memory_share(gpumem.GIB, "cuda"):
            assert _shares(tmp_path) == {str(os.getpid()): gpumem.GIB}
            raise AssertionError("the test failed")
    assert _shares(tmp_path) == {}


def test_a_test_that_reserves_more_than_it_asked_is_warned_of(tmp_path, monkeypatch):
    cuda = _FakeCuda(monkeypatch, tmp_path, peak=3 * gpumem.GIB)
    with pytest.warns(UserWarning, match=r"asked for 2\.0 GiB .* reserved 3\.0 GiB"):
        with gpumem.gpu_memory_share(2 * gpumem.GIB, "cuda"):
            pass
    assert cuda.emptied == 2 and _shares(tmp_path) == {}  # the cache emptied before and after
