"""What every benchmark here shares: a command line whose ``--help`` works on any machine, and
the result files a run leaves.

A run writes ``OUT.json`` (the measurement, plus ``"run"``: the card, the commit of the checkout
measured, the date, the command, torch and Triton) and ``OUT.md`` beside it (the same header
and everything the run printed). ``docs/results/<benchmark>/<card>.json`` and ``.md`` are the
latest such pair per benchmark and card; ``python benchmarks/results.py`` summarises them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# the command line of this run, as the benchmark's parser read it ("python benchmarks/x.py ...")
_COMMAND: list[str] = []


class _Parser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        ns = super().parse_args(argv, namespace)
        _COMMAND[:] = self.prog.split() + argv
        return ns


def parser(doc: str, prog: str) -> argparse.ArgumentParser:
    """The argparse parser of a benchmark: its module docstring as the description; what it
    parses is the command its result files record."""
    return _Parser(prog=f"python benchmarks/{prog}", description=doc,
                   formatter_class=argparse.RawDescriptionHelpFormatter)


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return n


def positive_float(value: str) -> float:
    x = float(value)
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {value}")
    return x


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def card() -> str:
    """The GPU's name, or the CPU's where there is none."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()})"


def provenance(argv: list[str] | None = None) -> dict:
    """What a result file says about its run: ``argv`` is its command (default: the command
    the benchmark's parser read)."""
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    commit = _git("rev-parse", "HEAD")
    changed = bool(_git("status", "--porcelain", "--untracked-files=no"))
    argv = (_COMMAND or ["python", *sys.argv]) if argv is None else argv
    return {"card": card(), "commit": commit, "local_changes": changed,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "command": shlex.join(argv),
            "torch": torch.__version__, "triton": triton_version}


def header(benchmark: str, run: dict) -> str:
    """The markdown header of a result's ``.md``."""
    commit = run.get("commit") or "unknown"
    if run.get("local_changes"):
        commit += " (with uncommitted changes)"
    lines = [f"# {benchmark} on {run['card']}", "",
             f"- card: {run['card']}", f"- commit: {commit}", f"- date: {run['date']}",
             f"- command: `{run['command']}`"]
    if run.get("torch"):
        lines.append(f"- torch {run['torch']}"
                     + (f", Triton {run['triton']}" if run.get("triton") else ""))
    if run.get("note"):
        lines.append(f"- note: {run['note']}")
    return "\n".join(lines) + "\n"


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()


@contextlib.contextmanager
def recorded(out: str | Path | None, benchmark: str):
    """Yields ``save(data)``, which writes ``data`` with its ``"run"`` to ``out`` (call it as
    often as the run has something to keep); what the run prints meanwhile also goes, after
    the header, to ``out`` with the suffix ``.md`` once the run ends. ``out`` None: nothing
    is written."""
    printed = io.StringIO()
    run = provenance()
    saved = []

    def save(data):
        if out is None:
            return
        body = {**data, "run": run} if isinstance(data, dict) else {"rows": data, "run": run}
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(body, indent=1) + "\n")
        saved.append(True)

    stdout = sys.stdout
    sys.stdout = _Tee(stdout, printed)
    try:
        yield save
    finally:
        sys.stdout = stdout
        if out is not None and saved:
            Path(out).with_suffix(".md").write_text(
                header(benchmark, run) + "\n```text\n" + printed.getvalue().rstrip() + "\n```\n")


def add_out(ap: argparse.ArgumentParser, required: bool = True) -> None:
    """The OUT.json argument (``OUT.md`` is written beside it)."""
    kw = {} if required else {"nargs": "?", "default": None}
    ap.add_argument("out", metavar="OUT.json", **kw,
                    help="result file (the printed tables go to OUT.md beside it)")
