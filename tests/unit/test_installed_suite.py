"""The conformance suite as engines run it: from a built wheel, installed apart from this
checkout, started from an empty directory (``pytest -p dcp_a2a.testing.plugin --pyargs
dcp_a2a.testing.conformance``). Keeps the installed form from rotting: package data
(tolerances.yaml, the lm-eval task), the mapped packages (dcp_a2a.reference, dcp_a2a.evals),
the mutant corpus and the plugin must all be in the wheel and work from there."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def test_wheel_ships_the_suite_and_runs_it_from_anywhere(tmp_path):
    wheels = tmp_path / "wheels"
    proc = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                 "-w", str(wheels), str(ROOT)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = wheels.glob("dcp_a2a-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ("dcp_a2a/testing/tolerances.yaml", "dcp_a2a/testing/plugin.py",
                 "dcp_a2a/testing/conformance/test_wire_format.py",
                 "dcp_a2a/testing/conformance/numerics/test_bound.py",
                 "dcp_a2a/testing/mutants/lse_halves_swapped.py",
                 "dcp_a2a/reference/contract.py", "dcp_a2a/evals/gsm8k.py",
                 "dcp_a2a/evals/tasks/gsm8k_local/gsm8k_local.yaml"):
        assert must in names, f"{must} is not in {wheel.name}"
    assert not any(n.startswith(("tests/", "reference/", "evals/")) for n in names), \
        "generic top-level names in the wheel"
    site = tmp_path / "site"
    proc = _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                 str(site), str(wheel)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("DCP_A2A_IMPL", None)
    where = _run([sys.executable, "-c", "import dcp_a2a.testing.tolerances as t, dcp_a2a;"
                  "print(dcp_a2a.__file__); print(t.tolerances_path())"], cwd=work, env=env)
    pkg, tol = where.stdout.split()
    assert pkg.startswith(str(site)) and tol.startswith(str(site)), where.stdout + where.stderr
    proc = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                 "-p", "dcp_a2a.testing.plugin", "--pyargs", "dcp_a2a.testing.conformance",
                 "-m", "conformance and unit", "-k", "lse_pack_dim or rejects_fp8", "-q"],
                cwd=work, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
