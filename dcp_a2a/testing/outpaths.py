"""Where the harness writes its results, checked before any work: a job that runs for minutes
must not end in a traceback that loses what it measured. Each check returns why the path cannot
be used, or None."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def dir_problem(path) -> str | None:
    """A report directory, made by the caller once the work starts: an existing one must be a
    directory it can write in; a new one, a directory it can write in as its nearest existing
    ancestor. Nothing is created here (a refused run leaves nothing behind)."""
    path = Path(path).absolute()
    base = path
    while not base.exists() and base.parent != base:
        base = base.parent
    if base == path:
        if not path.is_dir():
            return "exists and is not a directory"
        why = _unwritable(path)
        return f"cannot be written in ({why})" if why else None
    if not base.is_dir():
        return f"cannot be created ({base} is not a directory)"
    why = _unwritable(base)
    return f"cannot be created ({base}: {why})" if why else None


def file_problem(path) -> str | None:
    """A report file: not a directory, in a directory that exists and can be written."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return "is a directory"
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        return f"directory {parent} does not exist"
    why = _unwritable(Path(parent))
    return f"cannot write in {parent} ({why})" if why else None


def _unwritable(directory: Path) -> str | None:
    """Why a file cannot be made in ``directory`` (one is made and removed), or None."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".dcp-a2a-probe-"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None
