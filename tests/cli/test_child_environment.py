"""Where an implementation lives never decides its verdict: every process the harness starts
(pytest sessions, the self-check's runs, gpu-check's steps, torchrun ranks) gets the caller's
PYTHONPATH with the directories it needs put first, never in place of it
(``dcp_a2a.testing.childenv``). The torchrun accuracy job's tests once set PYTHONPATH to the
checkout alone: a correct implementation reached through the caller's PYTHONPATH or working
directory failed with "cannot import implementation module" on every rank
(tests/multiproc/test_accuracy_job.py runs that job for real from both places)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dcp_a2a.testing.childenv import child_env, pythonpath

pytestmark = pytest.mark.unit


def test_the_callers_entries_stay_behind_the_ones_put_first():
    assert pythonpath("/pkg", base=os.pathsep.join(["/a", "", "/b", "/pkg"])) == \
        os.pathsep.join(["/pkg", "/a", "/b"])
    env = child_env("/pkg", "/repo", base={"PYTHONPATH": "/mine", "X": "1"}, Y=2)
    assert env == {"PYTHONPATH": os.pathsep.join(["/pkg", "/repo", "/mine"]), "X": "1",
                   "Y": "2"}
    assert child_env("/pkg", base={})["PYTHONPATH"] == "/pkg"


def test_a_child_imports_what_the_caller_reaches_only_through_its_pythonpath(tmp_path,
                                                                            monkeypatch):
    """A module reached only through the caller's PYTHONPATH, imported by a child started
    elsewhere with the harness's environment."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "only_here_impl.py").write_text("VALUE = 7\n")
    monkeypatch.setenv("PYTHONPATH", str(home))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-c", "import only_here_impl; "
                           "print(only_here_impl.VALUE)"], cwd=elsewhere, capture_output=True,
                          text=True, env=child_env(tmp_path / "package_parent"))
    assert proc.returncode == 0 and proc.stdout.strip() == "7", proc.stderr
