"""Where the harness writes its results, checked before any work: a job that runs for minutes
must not end in a traceback that loses what it measured, and a path that makes no sense (an
empty one, which would mean the working directory) is refused rather than guessed at.

Every program follows the same rules: an output directory, or an output file's directory, is
created when the work starts if it is missing; it is refused up front when the path is empty,
names a file where a directory is wanted (or a directory where a file is), or cannot be created
or written. Each check returns why the path cannot be used, or None; nothing is created by a
check (a refused run leaves nothing behind)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def dir_problem(path) -> str | None:
    """Why ``path`` cannot be a report directory: an existing one must be a directory it can
    write in; a new one, a directory it can write in as its nearest existing ancestor."""
    if not str(path).strip():
        return "is empty (name a directory; '.' for this one)"
    path = Path(path).expanduser().absolute()
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
    """Why ``path`` cannot be a report file: not a directory, in a directory that exists or can
    be created (:func:`dir_problem`)."""
    if not str(path).strip():
        return "is empty (name a file)"
    if str(path).endswith(("/", os.sep)):
        return "ends with a path separator (name a file)"
    path = Path(path).expanduser().absolute()
    if path.is_dir():
        return "is a directory (name a file)"
    why = dir_problem(path.parent)
    return f"its directory {path.parent} {why}" if why else None


def make_dir(path) -> Path:
    """The report directory ``path`` (checked by :func:`dir_problem`), created if missing."""
    path = Path(path).expanduser().absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path


def make_parent(path) -> Path:
    """The report file ``path`` (checked by :func:`file_problem`), its directory created."""
    path = Path(path).expanduser().absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _unwritable(directory: Path) -> str | None:
    """Why a file cannot be made in ``directory`` (one is made and removed), or None."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".dcp-a2a-probe-"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None
