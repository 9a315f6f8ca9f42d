"""One GPU's memory, shared by the test processes that use it.

Each xdist worker has its own CUDA context and caching allocator and cannot see what the other
workers are about to allocate. On an 80 GiB H100, eight workers that each started a
launch-invariance test at the same time (each peaking at 11-28 GiB) used up the card. The
out-of-memory errors then hit those tests, the small tests that ran next to them, and every
rank of the gloo pools started next (``torch.cuda.set_device`` failed in each): 44 failures
on correct code. A 139 GiB H200 had room for the same session.

A test that needs a large share of the card asks for it first::

    with gpu_memory_share(nbytes):
        ...  # allocate

The call waits until the shares held by the other processes leave room for ``nbytes``
within :func:`budget`. A share larger than the budget waits until no other share is held,
then runs alone. On exit the caching allocator returns its cached blocks to the driver
(``torch.cuda.empty_cache``) before the share is released, so the next test can use them.
The shares are recorded in a JSON file per card (in the temporary directory, under a file
lock). Entries of dead processes are dropped, so a worker that crashes while holding a share
does not block the others. Without CUDA the call does nothing.

A test that uses more than it asked for still runs. Its measured peak
(``torch.cuda.max_memory_reserved``) is then reported in a warning, which tells you to
correct the request.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

GIB = 1 << 30
# What the shares may add up to: the card less what is not asked for. That is the CUDA
# contexts of the workers and of the pool's ranks (~0.5 GiB each: up to 16 workers and 8 ranks
# on a GPU machine) and the tests too small to ask.
BUDGET_FRACTION = 0.75
POLL_S = 0.25
WAIT_LIMIT_S = 900.0  # then run anyway: an out-of-memory error names itself, a hang does not


def _state_path(device=None) -> Path:
    """One file per card, named by its UUID. That covers every process on the machine that
    asks for shares of this card: the workers of one session, and sessions run side by side."""
    import torch

    props = torch.cuda.get_device_properties(device or 0)
    card = str(getattr(props, "uuid", "") or torch.cuda.current_device())
    return Path(tempfile.gettempdir()) / f"dcp_a2a_gpu_shares_{card}.json"


def budget(device=None) -> int:
    """Bytes the shares of every process may add up to on ``device``."""
    import torch

    return int(torch.cuda.get_device_properties(device or 0).total_memory * BUDGET_FRACTION)


def _update(path: Path, change) -> bool:
    """Apply ``change(shares) -> bool`` to the shares {pid: bytes} under the lock and write
    them back. Returns what ``change`` returned."""
    from filelock import FileLock

    from .rankpool import pid_alive

    with FileLock(str(path) + ".lock"):
        try:
            shares = {int(k): v for k, v in json.loads(path.read_text()).items()}
        except (FileNotFoundError, ValueError):
            shares = {}
        shares = {pid: n for pid, n in shares.items() if pid_alive(pid)}
        done = change(shares)
        path.write_text(json.dumps(shares))
    return done


def acquire(nbytes: int, limit: int, path: Path, *, wait_limit_s: float = WAIT_LIMIT_S) -> float:
    """Wait until ``nbytes`` fits within ``limit`` next to the other processes' shares (or until
    no other share is held, for a request larger than ``limit``), then record it. Returns the
    seconds waited."""
    pid = os.getpid()
    t0 = time.monotonic()

    def take(shares) -> bool:
        held = sum(n for p, n in shares.items() if p != pid)
        if held == 0 or held + nbytes <= limit or time.monotonic() - t0 > wait_limit_s:
            shares[pid] = shares.get(pid, 0) + nbytes
            return True
        return False

    while not _update(path, take):
        time.sleep(POLL_S)
    return time.monotonic() - t0


def release(nbytes: int, path: Path) -> None:
    pid = os.getpid()

    def give(shares) -> bool:
        left = shares.get(pid, 0) - nbytes
        if left > 0:
            shares[pid] = left
        else:
            shares.pop(pid, None)
        return True

    _update(path, give)


@contextlib.contextmanager
def gpu_memory_share(nbytes: int, device=None):
    """Hold ``nbytes`` of the card's memory for the duration (see the module docstring)."""
    import torch

    if not torch.cuda.is_available() or torch.device(device or "cuda").type != "cuda":
        yield
        return
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    path = _state_path(device)
    acquire(nbytes, budget(device), path)
    peak = 0
    try:
        torch.cuda.empty_cache()  # what earlier tests left cached is not part of this share
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_reserved(device)
        yield
        peak = torch.cuda.max_memory_reserved(device) - before
    finally:
        try:  # after a CUDA error these raise too; the share is given back all the same
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        finally:
            release(nbytes, path)
    if peak > nbytes:
        warnings.warn(f"a test asked for {nbytes / GIB:.1f} GiB of GPU memory and reserved "
                      f"{peak / GIB:.1f} GiB at its peak: ask for more "
                      "(dcp_a2a.testing.gpumem)", stacklevel=3)
