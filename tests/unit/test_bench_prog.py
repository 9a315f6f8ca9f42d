"""The benchmark is one program under every name it is run by: ``dcp-a2a bench``, the console
script ``dcp-a2a-bench`` and ``python -m dcp_a2a.testing.bench`` parse the same flags the same
way, and ``--help`` names the command to type."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcp_a2a.testing import bench, cli

pytestmark = pytest.mark.unit


def test_every_name_runs_the_same_program():
    """``dcp-a2a bench ARGS`` and ``bench.main(ARGS)`` (what the console script and ``python -m``
    call) parse alike, defaults filled in by the same checks."""
    argv = ["--grid", "--rounds", "5", "--tables", "table"]
    seen = [(args.grid, args.rounds, args.tables, args.settle_rounds)
            for args in (cli.parse(["bench", *argv]), cli.arguments("bench", argv))]
    assert seen[0] == seen[1] == (True, 5, ["table"], 9)


def test_usage_names_the_command_to_type(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: dcp-a2a bench ")


def test_console_script_is_the_one_pyproject_installs():
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '\ndcp-a2a-bench = "dcp_a2a.testing.bench:main"\n' in pyproject
    assert '\ndcp-a2a = "dcp_a2a.testing.cli:main"\n' in pyproject
