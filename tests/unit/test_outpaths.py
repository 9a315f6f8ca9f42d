"""Where the harness writes its results is checked before any work (``dcp_a2a.testing.
outpaths``): a self-check or a benchmark that runs for minutes ended in a FileNotFoundError
traceback after all its runs, losing what it measured; validate and gpu-check died the same way
on an --out they could not create."""

from __future__ import annotations

import time

import pytest

from dcp_a2a.testing import bench, numerics_report, selfcheck
from dcp_a2a.testing.outpaths import dir_problem, file_problem

pytestmark = pytest.mark.unit


def test_dir_problem(tmp_path):
    """Nothing is created (a refused run leaves nothing behind)."""
    assert dir_problem(tmp_path / "a" / "b") is None and not (tmp_path / "a").exists()
    assert dir_problem(tmp_path) is None
    (tmp_path / "f").write_text("")
    assert dir_problem(tmp_path / "f") == "exists and is not a directory"
    assert dir_problem(tmp_path / "f" / "x") == f"cannot be created ({tmp_path / 'f'} is not a " \
                                                "directory)"
    assert dir_problem("/proc/nope/x").startswith("cannot be created (/proc: ")


def test_file_problem(tmp_path):
    """A missing directory of a report file is created when it is written, as a report
    directory is (nothing is created by the check)."""
    assert file_problem(tmp_path / "r.json") is None and not (tmp_path / "r.json").exists()
    assert file_problem(tmp_path) == "is a directory (name a file)"
    assert file_problem(tmp_path / "no" / "r.json") is None and not (tmp_path / "no").exists()
    (tmp_path / "f").write_text("")
    assert file_problem(tmp_path / "f" / "r.json") == (
        f"its directory {tmp_path / 'f'} exists and is not a directory")
    assert file_problem("") == "is empty (name a file)"


def test_an_empty_path_is_refused_not_read_as_the_working_directory():
    assert dir_problem("") == dir_problem("  ") == "is empty (name a directory; '.' for this one)"


@pytest.mark.parametrize("argv, says", [
    (["--json", "/proc/nope/x.json"], "--json: /proc/nope/x.json: its directory /proc/nope "
                                      "cannot be created"),
    (["--workdir", "/proc/nope/w"], "--workdir: /proc/nope/w: cannot be created")])
def test_selfcheck_refuses_an_unusable_output_before_any_run(capsys, argv, says):
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        selfcheck.main(["--correct", "--only", "truncating_output_cast", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert time.monotonic() - t0 < 10  # no pytest session was started


def test_bench_refuses_an_unusable_out_before_timing(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--quick", "--out", "/proc/nope/b.json"])
    assert e.value.code == 2
    assert "--out: /proc/nope/b.json: its directory /proc/nope cannot be created" in \
        capsys.readouterr().err


def test_numerics_report_refuses_an_unusable_out_before_its_runs(capsys):
    with pytest.raises(SystemExit) as e:
        numerics_report.main(["--out", "/proc/nope/nr", "--no-progress"])
    assert e.value.code == 2 and "--out /proc/nope/nr: cannot be created" in \
        capsys.readouterr().err
