"""The conformance suite as engines run it: from a built wheel, installed apart from this
checkout, started from an empty directory. Keeps the installed form from rotting: every
package of the source tree in the wheel (a subpackage left out of pyproject's list broke
``--impl vllm`` once), package data (tolerances.yaml, the lm-eval task), the mapped packages
(dcp_a2a.reference, dcp_a2a.evals), the plugin, and every documented ``--impl`` form. One wheel
build (seconds) serves every test here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# source folder -> the package it is installed as (pyproject's package-dir)
MAPPED = {"dcp_a2a": "dcp_a2a", "reference": "dcp_a2a.reference", "evals": "dcp_a2a.evals"}


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, site, env, work): the wheel built once, installed with --target into ``site``,
    and an environment that sees only it, run from the empty directory ``work``."""
    tmp = tmp_path_factory.mktemp("wheel")
    # built from a copy without build outputs: setuptools would otherwise pack a stale build/lib
    # left by an earlier build (a package since dropped from the list would still ship)
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        "validation-report", "gpu-check", "out", ".whl", ".gl", ".hypothesis"))
    wheels = tmp / "wheels"
    proc = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                 "-w", str(wheels), str(src)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = wheels.glob("dcp_a2a-*.whl")
    site = tmp / "site"
    proc = _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                 str(site), str(wheel)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = tmp / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("DCP_A2A_IMPL", None)
    return wheel, site, env, work


def _source_packages() -> set[str]:
    found = set()
    for folder, name in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join([name, *rel.parts]))
    return found


def test_wheel_ships_every_package_and_the_suite_runs_from_anywhere(installed):
    wheel, site, env, work = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    missing = sorted(_source_packages() - shipped)
    assert not missing, f"packages of the source tree not in {wheel.name}: {missing}"
    for must in ("dcp_a2a/testing/tolerances.yaml", "dcp_a2a/testing/plugin.py",
                 "dcp_a2a/testing/conformance/test_wire_format.py",
                 "dcp_a2a/testing/conformance/numerics/test_bound.py",
                 "dcp_a2a/testing/mutants/lse_halves_swapped.py",
                 "dcp_a2a/testing/adapters/vllm.py",
                 "dcp_a2a/reference/contract.py", "dcp_a2a/reference/adapter_example.py",
                 "dcp_a2a/evals/gsm8k.py",
                 "dcp_a2a/evals/tasks/gsm8k_local/gsm8k_local.yaml"):
        assert must in names, f"{must} is not in {wheel.name}"
    assert not any(n.startswith(("tests/", "reference/", "evals/")) for n in names), \
        "generic top-level names in the wheel"
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


def test_every_documented_impl_form_loads_from_the_wheel(installed):
    """``--impl dcp_a2a.reference.adapter_example`` and ``.contract`` load; ``--impl vllm``
    reaches its adapter, which says vLLM is missing (not that the adapter package is)."""
    _, site, env, work = installed
    code = ("from dcp_a2a.testing.impl import load_impl\n"
            "for spec in ('dcp_a2a.reference.adapter_example', 'dcp_a2a.reference.contract'):\n"
            "    impl = load_impl(spec)\n"
            "    print(spec, impl.file, ','.join(impl.missing()) or '-')\n")
    proc = _run([sys.executable, "-c", code], cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in proc.stdout.splitlines():
        spec, file, missing = line.split()
        assert file.startswith(str(site)) and missing == "-", line
    proc = _run([sys.executable, "-m", "dcp_a2a", "validate", "--impl", "vllm", "--quick",
                 "--out", str(work / "report")], cwd=work, env=env)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "vLLM is not installed" in proc.stderr and "adapters" not in proc.stderr
