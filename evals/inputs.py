"""What an eval command needs before it starts, and the one-line failure when something is
missing.

Each driver checks its model and data first (file-system look-ups only, no model load and no
lm-eval import) and, when one is missing, prints one line naming what is missing and the
command that fixes it, and exits with status 2 -- no traceback, no minute spent loading a
model before failing.
"""

from __future__ import annotations

import argparse
import sys


class MissingInput(FileNotFoundError):
    """A model, data file or package that a command needs is not there.

    ``what``: what is missing (with where it was looked for); ``fix``: the command or option
    that provides it."""

    def __init__(self, what: str, fix: str):
        super().__init__(f"{what}; fix: {fix}")
        self.what = what
        self.fix = fix


def fail(prog: str, err: MissingInput, quiet: bool = False):
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
