"""Where the harness writes its results, checked before any work: a job that runs for minutes
must not end in a traceback that loses what it measured. Each check returns why the path cannot
be used, or None."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def dir_problem(path) -> str | None:
    """A report directory: created if absent, and a file made and removed in it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "exists and is not a directory"
    except OSError as e:
        return f"cannot be created ({e.strerror or e})"
    return _writable(path)


def file_problem(path) -> str | None:
    """A report file: not a directory, in a directory that exists and can be written."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return "is a directory"
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        return f"directory {parent} does not exist"
    return _writable(Path(parent), where=f" in {parent}")


def _writable(directory: Path, where: str = "") -> str | None:
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".dcp-a2a-probe-"):
            pass
    except OSError as e:
        return f"cannot write{where} ({e.strerror or e})"
    return None
