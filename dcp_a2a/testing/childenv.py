"""The environment of a process the harness starts (a pytest session, a torchrun job, a rank).

The child must import this package and the implementation under test from the same places
the caller does. So the directories the child needs go FIRST on ``PYTHONPATH`` and the
caller's entries stay after them, never replaced: an implementation reachable through the
caller's ``PYTHONPATH`` (or through its working directory, which :mod:`.impl` puts there) is
reachable in every process of the run, and where it lives never decides its verdict.
"""

from __future__ import annotations

import os


def pythonpath(*first, base: str | None = None) -> str:
    """``first`` (paths), then the entries of ``base`` (default: this process's
    ``$PYTHONPATH``), each once, in that order."""
    base = os.environ.get("PYTHONPATH", "") if base is None else base
    out = []
    for p in [str(d) for d in first] + base.split(os.pathsep):
        if p and p not in out:
            out.append(p)
    return os.pathsep.join(out)


def child_env(*first, base: dict | None = None, **set_vars) -> dict:
    """A copy of ``base`` (default: ``os.environ``) with ``first`` put before its
    ``PYTHONPATH`` entries and ``set_vars`` set."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = pythonpath(*first, base=env.get("PYTHONPATH", ""))
    env.update({k: str(v) for k, v in set_vars.items()})
    return env
