"""``dcp-a2a-bench --help`` names the console script, ``python -m dcp_a2a.testing.bench --help``
the module (issue 48: the console script printed ``usage: python -m ...``)."""

from __future__ import annotations

import pytest

from dcp_a2a.testing import bench

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("argv0, prog", [
    ("/venv/bin/dcp-a2a-bench", "dcp-a2a-bench"),
    ("dcp-a2a-bench", "dcp-a2a-bench"),
    (r"C:\venv\Scripts\dcp-a2a-bench.exe", "dcp-a2a-bench"),
    ("/src/dcp_a2a/testing/bench.py", "python -m dcp_a2a.testing.bench"),  # python -m
    ("/venv/bin/dcp-a2a", "python -m dcp_a2a.testing.bench"),
])
def test_usage_names_the_command_as_run(monkeypatch, argv0, prog):
    monkeypatch.setattr("sys.argv", [argv0, "--help"])
    assert bench.build_parser().format_usage().startswith(f"usage: {prog} ")
    assert bench.prog_name(argv0) == prog


def test_console_script_is_the_one_pyproject_installs():
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'\n{bench.CONSOLE_SCRIPT} = "dcp_a2a.testing.bench:main"\n' in pyproject
