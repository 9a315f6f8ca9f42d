"""The machine's cores shared among the harness's processes (xdist workers, self-check runs).

Each process's torch would otherwise run its CPU ops on as many threads as the machine has
cores, and P processes at once oversubscribe them P times. Measured on the 2-core CI machine:
the README's test command (2 xdist workers) 164.0-165.0 s of pytest with 2 threads a worker,
139.5-142.9 s with 1; ``python -m dcp_a2a.testing.selfcheck`` (2 runs at a time) 83.6 s
-> 70.0 s.
"""

from __future__ import annotations

import os

THREADS_ENV = "OMP_NUM_THREADS"


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (containers)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_share(processes: int) -> int | None:
    """Threads each of ``processes`` processes running at once should use, or None where the
    user set ``OMP_NUM_THREADS`` (theirs wins)."""
    if THREADS_ENV in os.environ:
        return None
    return max(1, available_cores() // max(1, processes))
