"""A process whose CUDA context the code under test destroyed runs no further test.

An illegal access in the code under test poisons the process's CUDA context: every later CUDA
call in that process fails with the same error, so every later test there would fail for the
code that ran before it. The test that lost the context keeps its own verdict (memory unsafety,
with CUDA's error and its reproducer); every later test in that process is skipped as not run
(:data:`NOT_RUN`), never judged. ``dcp-a2a engines`` runs those in a further session, in fresh
processes.

(Ending the pytest-xdist worker instead, for xdist to start a fresh one, was tried: on one H100,
2026-12-07, the session then waited for ever on tests handed to the replacement.)
"""

from __future__ import annotations

import pytest

NOT_RUN = "not run: this process lost its CUDA context to memory unsafety in "

_lost_in: list[str] = []


def lost(nodeid: str) -> None:
    """The test ``nodeid`` left this process's CUDA context unusable."""
    _lost_in.append(nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _lost_in:
        pytest.skip(NOT_RUN + _lost_in[0])
