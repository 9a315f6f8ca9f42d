"""What an eval command needs before it starts, and the one-line failure when something is
missing.

Each driver checks its model and data first (file-system look-ups only, no model load and no
lm-eval import) and, when one is missing, prints one line naming what is missing and the
command that fixes it, and exits with status 2 -- no traceback, no minute spent loading a
model before failing.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys


class MissingInput(FileNotFoundError):
    """A model, data file or package that a command needs is not there.

    ``what``: what is missing (with where it was looked for); ``fix``: the command or option
    that provides it."""

    def __init__(self, what: str, fix: str):
        super().__init__(f"{what}; fix: {fix}")
        self.what = what
        self.fix = fix


def fail(prog: str, err: Exception, quiet: bool = False):
    """Print ``prog: error: <what>; fix: <fix>`` as one line on stderr (unless ``quiet``: the
    other ranks of a torchrun job, which fail the same way) and exit with status 2."""
    if not quiet:
        print(f"{prog}: error: {err}".replace("\n", " "), file=sys.stderr, flush=True)
    raise SystemExit(2)


def require_module(name: str, what: str, fix: str) -> None:
    """:class:`MissingInput` unless the module ``name`` can be found (it is not imported)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingInput(what, fix)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The command's docstring as written, and every option's default (a flag's help says
    what it turns on, so no "(default: False)" there)."""

    def _get_help_string(self, action):
        if action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the usage error as one line on stderr -- ``prog: error: <message>`` --
    and exit status 2 (argparse prints the whole usage first, which buries the line that names
    the option)."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr, flush=True)
        raise SystemExit(2)


def positive_int(value: str) -> int:
    """argparse type: an integer >= 1 (``argument --x: expected ...`` otherwise)."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return n


def comma_list(choices, what: str):
    """argparse type: a comma-separated, non-empty list of distinct items from ``choices``
    (returned as the list)."""

    def parse(value: str) -> list[str]:
        items = [x.strip() for x in value.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(map(repr, bad)) or '(none given)'}; expected "
                f"some of {', '.join(choices)}")
        dup = sorted({x for x in items if items.count(x) > 1})
        if dup:
            raise argparse.ArgumentTypeError(f"{what} {', '.join(dup)} given twice")
        return items

    parse.__name__ = what
    return parse


def check_out_dir(ap, out) -> None:
    """A usage error unless the ``--out`` directory can be made and written: checked before the
    model loads, so that a run never ends with results it cannot write."""
    from dcp_a2a.testing.outpaths import dir_problem

    why = dir_problem(out)
    if why:
        ap.error(f"argument --out: {out} {why}")


def check_device(value: str | None) -> str | None:
    """``value`` if torch can place tensors there (a CUDA device needs CUDA and that index),
    else ValueError naming it; None passes (the command's default)."""
    if value is None:
        return None
    import torch

    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{value!r} is not a torch device (cpu, cuda, cuda:N)") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"{value}: CUDA is not available here")
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"{value}: only {n} CUDA device(s) here")
    elif dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{value}: the evals run on cpu or cuda")
    return value


@contextlib.contextmanager
def quiet_git():
    """lm-eval's simple_evaluate runs ``git describe --always`` for its results' git_hash
    without redirecting git's stderr: outside a git checkout git prints ``fatal: not a git
    repository`` on ours. Within this context its lookup is the same command with git's stderr
    discarded."""
    import lm_eval.evaluator as ev

    original = getattr(ev, "get_git_commit_hash", None)
    if original is None:  # another lm-eval: nothing to quieten
        yield
        return

    def quiet():
        try:
            return subprocess.check_output(["git", "describe", "--always"],
                                           stderr=subprocess.DEVNULL).strip().decode()
        except (OSError, subprocess.CalledProcessError):
            return None

    ev.get_git_commit_hash = quiet
    try:
        yield
    finally:
        ev.get_git_commit_hash = original
