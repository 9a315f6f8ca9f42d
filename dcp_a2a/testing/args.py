"""The flag rules every ``dcp-a2a`` program shares: one type per kind of value, so that a flag
means the same thing, and refuses the same values, in every program.

A bad value is a usage error before any work starts: one line on stderr,
``PROG: error: argument --FLAG: what is wrong; what is allowed``, and exit status 2. Under
torchrun every rank checks its arguments before the process group starts and only rank 0 prints
the line (the others exit 2 silently), so that N ranks do not print N copies.

The rules:

* counts are whole numbers in a stated range (``--iters 0`` or ``-5`` is refused, never read as
  one); an upper bound where a huge value would only look like a hang;
* numbers are finite (``nan`` and ``inf`` are refused) and in their range;
* lists are comma-separated, non-empty, of known items, each at most once (``float32,float32``
  would run the same case twice);
* an output directory is created when the work starts if it is missing, and refused up front
  when it is empty (``--out ''`` would write into the working directory), a file, or cannot be
  created or written; an output file likewise (its missing parent directories are created);
* an input path must exist and be of the kind asked for.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """argparse with a usage error as one line (``PROG: error: MESSAGE (see PROG --help)``)
    and exit status 2; under torchrun, printed by rank 0 only."""

    def error(self, message):
        if os.environ.get("RANK", "0") == "0":
            print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr,
                  flush=True)
        elif os.environ.get("TORCHELASTIC_RUN_ID"):
            # torchrun stops every rank as soon as one exits with an error: a silent rank that
            # got here first (rank 0 still importing torch on a loaded machine) would take rank
            # 0's line with it. Rank 0 parses the same arguments and exits 2 in a moment;
            # torchrun then stops this one.
            import time

            time.sleep(RANK_WAIT_S)
        raise SystemExit(EXIT_USAGE)


# how long a silent rank waits for rank 0 to print the usage error (torchrun ends it earlier)
RANK_WAIT_S = 120


def _whole(value: str) -> int | None:
    try:
        return int(value.strip())
    except (ValueError, AttributeError):
        return None


def count(lo: int = 1, hi: int | None = None, what: str = "a whole number"):
    """A whole number from ``lo`` to ``hi`` (no upper bound when None)."""
    allowed = f"{what} from {lo} to {hi}" if hi is not None else f"{what} >= {lo}"

    def parse(value: str) -> int:
        n = _whole(value)
        if n is None or n < lo or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {value!r}")
        return n

    parse.__name__ = "count"
    return parse


positive_int = count(1)
non_negative_int = count(0)


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False, what: str = "a number"):
    """A finite number in [``lo``, ``hi``] (``lo_open``: above ``lo``; ``hi_open``: below
    ``hi``)."""
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    allowed = f"a finite {what}" + (f" {' and '.join(parts)}" if parts else "")

    def parse(value: str) -> float:
        try:
            x = float(value)
        except (ValueError, TypeError):
            x = math.nan
        if not math.isfinite(x) or (lo is not None and (x <= lo if lo_open else x < lo)) or (
                hi is not None and (x >= hi if hi_open else x > hi)):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {value!r}")
        return x

    parse.__name__ = "number"
    return parse


def seconds(*, zero: str | None = None):
    """A finite number of seconds > 0, or >= 0 when ``zero`` says what 0 means."""
    if zero is None:
        return number(0, lo_open=True, what="number of seconds")
    inner = number(0, what="number of seconds")

    def parse(value: str) -> float:
        try:
            return inner(value)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (0: {zero})") from None

    parse.__name__ = "seconds"
    return parse


def items(choices, what: str, *, all_value: str | None = None):
    """A comma-separated, non-empty list of distinct items of ``choices`` (or ``all_value``,
    meaning every choice), returned as a list in the order given."""
    choices = tuple(choices)

    def parse(value: str) -> list[str]:
        got = [x.strip() for x in value.split(",")]
        if got == [all_value] and all_value is not None:
            return list(choices)
        allowed = ((f"{all_value} or " if all_value else "")
                   + f"a comma list of {', '.join(choices)}")
        if not any(got) or not all(got):
            raise argparse.ArgumentTypeError(f"an empty {what} in {value!r}; expected {allowed}")
        bad = [x for x in got if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(map(repr, bad))}; expected {allowed}")
        twice = sorted({x for x in got if got.count(x) > 1}, key=got.index)
        if twice:
            raise argparse.ArgumentTypeError(f"{what} {', '.join(twice)} given twice")
        return got

    parse.__name__ = what
    return parse


class Distinct(argparse.Action):
    """For ``nargs`` lists: each value at most once, and at least one when a list is given."""

    def __call__(self, parser, namespace, values, option_string=None):
        values = list(values or [])
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            parser.error(f"argument {option_string}: {', '.join(twice)} given twice")
        setattr(namespace, self.dest, values)


def text(what: str):
    """A non-blank string (a blank one is an unset variable, typically)."""

    def parse(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"empty; expected {what}")
        return value.strip()

    parse.__name__ = "text"
    return parse


# --------------------------------------------------------------------------- paths

# Path types return the path as given (a string: a program's arguments go into its JSON report
# as they are), after checking it.

def out_dir(value: str) -> str:
    """An output directory (:func:`.outpaths.dir_problem`); the program creates it
    (:func:`.outpaths.make_dir`) when its work starts."""
    from .outpaths import dir_problem

    why = dir_problem(value)
    if why:
        raise argparse.ArgumentTypeError(f"{value!r}: {why}" if not value.strip() else
                                         f"{value}: {why}")
    return value


def out_file(value: str) -> str:
    """An output file (:func:`.outpaths.file_problem`); the program creates its directory
    (:func:`.outpaths.make_parent`) when it writes it."""
    from .outpaths import file_problem

    why = file_problem(value)
    if why:
        raise argparse.ArgumentTypeError(f"{value!r}: {why}" if not value.strip() else
                                         f"{value}: {why}")
    return value


def _existing(value: str, what: str, is_it) -> str:
    """``value`` where ``is_it(path)`` holds; else why not, naming ``what`` was expected."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"is empty (name a {what})")
    path = Path(value).expanduser()
    if not is_it(path):
        raise argparse.ArgumentTypeError(
            f"{value}: {f'not a {what}' if path.exists() else f'no such {what}'}")
    return value


def existing_dir(value: str) -> str:
    """A directory that exists."""
    return _existing(value, "directory", Path.is_dir)


def existing_path(value: str) -> str:
    """A file or directory that exists."""
    return _existing(value, "file or directory", Path.exists)


def existing_file(value: str) -> str:
    """A file that exists."""
    return _existing(value, "file", Path.is_file)


# --------------------------------------------------------------------------- other values

def workers(value: str):
    """pytest-xdist workers: ``auto`` (one per core) or a whole number, 0 for none, at most
    :data:`MAX_WORKERS_PER_CORE` per core."""
    from .cores import available_cores

    if value.strip() == "auto":
        return "auto"
    cap = MAX_WORKERS_PER_CORE * available_cores()
    n = _whole(value)
    if n is None or not 0 <= n <= cap:
        raise argparse.ArgumentTypeError(
            f"expected auto or a whole number from 0 (no xdist) to {cap} ({MAX_WORKERS_PER_CORE} "
            f"per core here), got {value!r}")
    return n


MAX_WORKERS_PER_CORE = 8


def processes(value: str) -> int:
    """A number of processes (workers, runs at a time): a whole number from 1 to
    :data:`MAX_WORKERS_PER_CORE` per core."""
    from .cores import available_cores

    cap = MAX_WORKERS_PER_CORE * available_cores()
    n = _whole(value)
    if n is None or not 1 <= n <= cap:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 1 to {cap} ({MAX_WORKERS_PER_CORE} per core here), "
            f"got {value!r}")
    return n


def pytest_marker(value: str) -> str:
    """A pytest ``-m`` expression, compiled as pytest compiles it."""
    if not value.strip():
        raise argparse.ArgumentTypeError("is empty; expected a pytest -m expression, e.g. "
                                         "conformance")
    try:
        from _pytest.mark.expression import Expression
    except ImportError:  # pytest absent: the run itself will say so
        return value
    try:
        Expression.compile(value)
    except Exception as e:  # ParseError (column, message) or, since pytest 9, SyntaxError
        column = getattr(e, "column", None) or getattr(e, "offset", None)
        why = getattr(e, "message", None) or getattr(e, "msg", None) or str(e)
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a pytest -m expression"
            + (f" at column {column}" if column else "") + f": {why}") from None
    return value


def shapes(dims: str, *, dtypes=(), example: str):
    """A comma list of distinct shapes ``dims`` (e.g. ``BxHxD``; B >= 0, every other size >= 1),
    each optionally ``:DTYPE`` of ``dtypes``; returned as a list of (sizes tuple, dtype or
    None)."""
    names = dims.split("x")
    form = dims + ("[:dtype]" if dtypes else "")

    def parse(value: str) -> list:
        got = [s.strip() for s in value.split(",")]
        if not any(got) or not all(got):
            raise argparse.ArgumentTypeError(
                f"an empty shape in {value!r}; expected a comma list of {form}, e.g. {example}")
        out = []
        for item in got:
            size, _, dt = item.partition(":")
            parts = size.lower().split("x")
            nums = [_whole(p) for p in parts]
            if len(parts) != len(names) or None in nums:
                raise argparse.ArgumentTypeError(
                    f"bad shape {item!r}: expected {form}, e.g. {example}")
            low = [f"{n} >= {0 if i == 0 else 1}" for i, (n, v) in enumerate(zip(names, nums))
                   if v < (0 if i == 0 else 1)]
            if low:
                raise argparse.ArgumentTypeError(f"bad shape {item!r}: need {', '.join(low)}")
            if dt and dt not in dtypes:
                raise argparse.ArgumentTypeError(
                    f"bad shape {item!r}: unknown dtype {dt!r}" + (
                        f" (one of {', '.join(dtypes)})" if dtypes else " (no dtype here)"))
            key = (tuple(nums), dt or None)
            if key in out:
                raise argparse.ArgumentTypeError(f"shape {item} given twice")
            out.append(key)
        return out

    parse.__name__ = "shapes"
    return parse


def under_torchrun() -> bool:
    """Whether torchrun (or a launcher like it) started this process as a rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
