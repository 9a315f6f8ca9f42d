"""The GPU memory shares of one pytest session (dcp_a2a.testing.gpumem): a share that does
not fit next to the others waits for them. One that fits does not wait. One larger than the
budget runs alone. A dead process's share is dropped. The bookkeeping needs no GPU. Real
processes hold the shares, since a share belongs to a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from dcp_a2a.testing import gpumem

pytestmark = pytest.mark.unit

# holds a share of argv[2] bytes (limit argv[3]) for argv[4] s; prints when it got and gave it
_HOLDER = r"""
import sys, time
from pathlib import Path
from dcp_a2a.testing import gpumem
path, n, limit, hold = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
gpumem.acquire(n, limit, path)
print("got", time.time(), flush=True)
time.sleep(hold)
print("gave", time.time(), flush=True)
gpumem.release(n, path)
"""


def _start(path, n, limit, hold):
    return subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), str(n), str(limit),
                             str(hold)], stdout=subprocess.PIPE, text=True)


def _times(proc):
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    t = dict(line.split() for line in out.splitlines())
    return float(t["got"]), float(t["gave"])


def _wait_until_held(path, nbytes):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if sum(json.loads(path.read_text()).values()) >= nbytes:
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError("the first share was never taken")


def test_a_share_that_does_not_fit_waits_and_one_that_fits_does_not(tmp_path):
    path = tmp_path / "shares.json"
    first = _start(path, 6, 10, 1.5)
    _wait_until_held(path, 6)
    too_big = _start(path, 6, 10, 0.0)    # 6 + 6 > 10: after the first gives its share back
    fits = _start(path, 3, 10, 0.0)       # 6 + 3 <= 10: at once
    first_got, first_gave = _times(first)
    big_got, _ = _times(too_big)
    fits_got, _ = _times(fits)
    assert big_got >= first_gave, (big_got, first_gave)
    assert fits_got < first_gave, (fits_got, first_gave)
    assert json.loads(path.read_text()) == {}  # every share given back


def test_a_share_larger_than_the_budget_runs_alone(tmp_path):
    path = tmp_path / "shares.json"
    small = _start(path, 1, 10, 1.0)
    _wait_until_held(path, 1)
    huge = _start(path, 50, 10, 0.0)
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
