"""Every command line the README and docs/ show in a shell block goes through its real parser:
the project's commands (``dcp-a2a``, ``dcp-a2a-bench``, ``python -m dcp_a2a...``, ``torchrun
... -m dcp_a2a...``, ``python benchmarks/SCRIPT.py`` and the other scripts of the checkout,
and the command ``benchmarks/record.py`` runs) through their own ``main`` up to argparse's
verdict, and every ``pytest`` line as a collection (``--co``), which is where a broken plugin or
conftest shows. A documented line that stopped parsing fails here, named by file and line.

Synopses are read as their shortest form: ``[optional parts]`` are dropped. Placeholders for
the reader's own code run as a stand-in that exists (``my_engine.dcp_adapter`` -> the reference
contract). docs/perf_history.md is a record of past passes, not a manual: left out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md")
                                     if p.name != "perf_history.md")
SHELL = ("", "bash", "sh", "shell", "console")
STAND_INS = {"my_engine.dcp_adapter": "dcp_a2a.reference.contract",
             "my_pkg.suspect_impl": "dcp_a2a.testing.mutants.lse_halves_swapped",
             "table,NAME": "table", "NAME": "smollm2", "SPEC": "dcp_a2a.reference.contract",
             # a folder the reader names: one that exists (an input folder must)
             "DIR": ".",
             # where the docs have the reader download the engines' wheels (docs/engines.md)
             "/tmp/engines": "."}
ENTRY_POINTS = {"dcp-a2a": "dcp_a2a.testing.cli", "dcp-a2a-bench": "dcp_a2a.testing.bench",
                "dcp_a2a": "dcp_a2a.testing.cli"}


def _shell_lines():
    """(where, command) of every line of a shell block, continuations joined."""
    for doc in DOCS:
        inside, lang = False, ""
        pending, first = "", 0
        for no, line in enumerate(doc.read_text().splitlines(), 1):
            m = re.match(r"^\s*```(\w*)", line)
            if m:
                inside, lang = not inside, m.group(1)
                continue
            if not inside or lang not in SHELL:
                continue
            if not pending:
                first = no
            pending += line.strip().removeprefix("$ ")
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            yield f"{doc.relative_to(ROOT)}:{first}", pending
            pending = ""


# a segment that runs one of the programs checked here (after VAR=value prefixes)
_OURS = re.compile(r"^(\w+=\S*\s+)*(\S*/)?(dcp-a2a|dcp-a2a-bench|pytest|torchrun|"
                   r"python3?(\.\d+)?)(\s|$)")


def _classify(where, argv, out):
    """Append (where, kind, target, argv) for one command's argv, if it is one of ours."""
    prog = Path(argv[0]).name
    if prog in ENTRY_POINTS:
        out.append((where, "main", ENTRY_POINTS[prog], argv[1:]))
    elif prog == "pytest":
        out.append((where, "pytest", None, argv[1:]))
    elif prog == "torchrun" and "-m" in argv:
        i = argv.index("-m")
        module = ENTRY_POINTS.get(argv[i + 1], argv[i + 1])  # -m dcp_a2a: the command line
        out.append((where, "main", module, argv[i + 2:]))
    elif re.fullmatch(r"python3?(\.\d+)?", prog) and argv[1:2] == ["-m"] and len(argv) > 2:
        mod, rest = argv[2], argv[3:]
        if mod == "pytest":
            out.append((where, "pytest", None, rest))
        elif mod.startswith("dcp_a2a"):
            out.append((where, "main", ENTRY_POINTS.get(mod, mod), rest))
    elif re.fullmatch(r"python3?(\.\d+)?", prog) and argv[1:2] and argv[1].endswith(".py"):
        out.append((where, "main", argv[1], argv[2:]))
        if Path(argv[1]).name == "record.py" and "--" in argv:  # and the command it records
            _classify(where, argv[argv.index("--") + 1:], out)


def _commands():
    """(where, kind, target, argv): kind 'main' (a module's or script's main) or 'pytest'."""
    out = []
    for where, line in _shell_lines():
        line = re.sub(r"\s+#\s.*$", "", line)
        for seg in line.split("&&"):
            seg = seg.strip()
            while re.search(r"\[[^\[\]]*\]", seg):
                seg = re.sub(r"\s*\[[^\[\]]*\]", "", seg)
            if not seg or "..." in seg or "|" in seg:
                continue
            if not _OURS.match(seg):
                continue
            for k, v in STAND_INS.items():
                seg = re.sub(rf"(?<![\w.]){re.escape(k)}(?![\w.])", v, seg)
            argv = shlex.split(seg)
            while argv and "=" in argv[0] and not argv[0].startswith("-"):
                argv = argv[1:]  # VAR=value prefixes
            if argv:
                _classify(where, argv, out)
    return out


COMMANDS = _commands()


class _Parsed(Exception):
    pass


def load_script(path: str):
    """A script of the checkout (``benchmarks/x.py``) as a module, its folder importable (the
    scripts import their neighbours by name)."""
    import importlib.util

    file = ROOT / path
    assert file.is_file(), f"{path}: no such script in the checkout"
    folder = str(file.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(f"_documented_{file.stem}", file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _parse_with_main(module: str, argv: list[str]):
    """Run ``module.main(argv)`` (``module`` a dotted name or a script's path) until argparse
    has judged the arguments: its namespace, or SystemExit(2) with argparse's message for a bad
    line."""
    real = argparse.ArgumentParser.parse_args
    seen = []

    def parse_then_stop(self, args=None, namespace=None):
        ns = real(self, args, namespace)
        seen.append(ns)
        raise _Parsed

    mod = load_script(module) if module.endswith(".py") else importlib.import_module(module)
    # a program whose main takes parsed arguments reads its command line in cli(argv), as its
    # `python -m` entry does (dcp_a2a.testing.engines)
    entry = getattr(mod, "cli", None) or mod.main
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop):
        try:
            entry(argv)
        except _Parsed:
            return seen[-1]
    raise AssertionError(f"{module}.{entry.__name__} returned without parsing its arguments")


def test_the_docs_show_the_commands_this_checks():
    kinds = {(k, t) for _, k, t, _ in COMMANDS}
    assert ("main", "dcp_a2a.testing.cli") in kinds and ("pytest", None) in kinds
    assert len(COMMANDS) >= 20, COMMANDS


MAIN_LINES = [(w, t, a) for w, k, t, a in COMMANDS if k == "main"]


@pytest.mark.parametrize("where, module, argv", MAIN_LINES, ids=[w for w, _, _ in MAIN_LINES])
def test_documented_command_parses(where, module, argv, capsys):
    try:
        _parse_with_main(module, argv)
    except SystemExit as e:  # argparse refused the documented line
        pytest.fail(f"{where}: `{module} {' '.join(argv)}` does not parse (exit {e.code}): "
                    f"{capsys.readouterr().err.strip()[-500:]}")


PYTEST_LINES = sorted({tuple(a) for _, k, _, a in COMMANDS if k == "pytest"})


# Collects every documented pytest line in turn in one process (a line each ran in a process of
# its own before: 4 s each, the python and torch start-up mostly). Each line is its own
# pytest.main: its own options, plugins, markers and --impl; the imports are shared, and a module
# that fails to import is not kept, so it fails every line that imports it.
_COLLECT_EACH = r"""
import contextlib, io, json, sys
import pytest
results = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = int(pytest.main([*argv, "--co", "-q", "-p", "no:cacheprovider"]))
        except BaseException as e:  # noqa: BLE001 - a line that kills its session is its result
            print(f"{type(e).__name__}: {e}")
            code = -1
    results.append({"code": code, "output": out.getvalue()[-4000:]})
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def collections():
    """{argv: (exit status, output)} of ``pytest ARGV --co`` for every documented line."""
    env = {k: v for k, v in os.environ.items() if k != "DCP_A2A_IMPL"}
    proc = subprocess.run([sys.executable, "-c", _COLLECT_EACH,
                           json.dumps([list(a) for a in PYTEST_LINES])],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(line[-1].removeprefix("RESULTS "))
    return {a: (r["code"], r["output"]) for a, r in zip(PYTEST_LINES, results)}


@pytest.mark.slow
@pytest.mark.xdist_group("documented_pytest_lines")  # one worker, one collecting process
@pytest.mark.parametrize("argv", PYTEST_LINES, ids=lambda a: " ".join(a)[:60])
def test_documented_pytest_line_collects(argv, collections):
    code, output = collections[argv]
    where = [w for w, k, _, a in COMMANDS if k == "pytest" and tuple(a) == argv]
    assert code == 0, f"{where}: `pytest {' '.join(argv)}` does not collect:\n{output[-3000:]}"
    assert re.search(r"\d+ tests? collected|\d+/\d+ tests collected", output), output
