"""A tiny synthetic suite (written into a temp dir) whose outcomes are known in advance, so the
validate pipeline can be checked end to end in a few seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PYTEST_INI = """\
[pytest]
markers =
    unit: u
    kernel: k
    multiproc: m
    conformance: c
    numerics: n
    gpu: g
    multigpu: mg
    e2e: e
    slow: s
    selfcheck: sc
"""

CONFTEST = '''\
import pytest


@pytest.fixture
def merge_report(request):
    def _rec(dtype, kind, ratio, hist, ulp):
        request.node.user_properties.append(("merge_report", {
            "dtype": dtype, "world_size": 2, "base": "e", "kind": kind,
            "output": {"quantity": "output", "elements": sum(hist), "max_abs_err": 0.0,
                       "max_ulp_err": ulp, "worst_ratio": ratio, "failures": int(ratio > 1),
                       "upstream_ok": True},
            "lse": None, "ulp_histogram": hist, "ok": ratio <= 1, "worst_ratio": ratio}))
    return _rec
'''

NBINS = 25


def hist(*pairs) -> list[int]:
    h = [0] * NBINS
    for i, c in pairs:
        h[i] = c
    return h


UNIT = f'''\
import pytest

pytestmark = pytest.mark.unit


def test_pass():
    pass


@pytest.mark.parametrize("x", [1, 2, 3])
def test_param(x):
    assert x > 0


@pytest.mark.slow
def test_slow_one():
    pass


@pytest.mark.kernel
@pytest.mark.conformance
def test_both_tiers(merge_report):
    import time
    time.sleep(0.3)  # the slowest test, by far
    merge_report("bfloat16", "a2a", 0.25, {hist((0, 90), (9, 10))!r}, 0.45)
'''

KERNEL_PASS = f'''\
import pytest


def test_unmarked_in_kernel_dir(merge_report):
    merge_report("float16", "a2a", 0.5, {hist((0, 40), (5, 2))!r}, 0.3)
    merge_report("float16", "ag_rs", 0.125, {hist((12, 7))!r}, 0.6)


@pytest.mark.gpu
@pytest.mark.kernel
def test_needs_gpu():
    pass
'''

KERNEL_FAIL = f'''\
import pytest

pytestmark = pytest.mark.kernel


def test_too_far(merge_report):
    merge_report("float16", "a2a", 2.0, {hist((10, 1))!r}, 0.6)
    assert False, "merge check: 1 of 1 elements over the bound"
'''

NUMERICS = '''\
import pytest

pytestmark = pytest.mark.numerics


def test_cannot_run_here():
    pytest.skip("needs something absent")
'''

MULTIGPU = '''\
import pytest


@pytest.mark.multigpu
def test_nccl():
    pass
'''

STRAY = '''\
import pytest


def test_in_no_tier():
    pass


@pytest.mark.selfcheck
def test_of_the_selfcheck():  # in no tier by design: listed apart, not as a stray
    pass
'''


CONTRACT_CASES = '''\
import pytest


@pytest.mark.unit
@pytest.mark.conformance
@pytest.mark.parametrize("case", [1, 2, 3])
def test_contract_case(case):
    pass
'''


DYING = '''\
import os

import pytest

pytestmark = pytest.mark.kernel


def test_before_the_death():
    pass


@pytest.mark.clause("masking")
def test_that_kills_the_process():
    os._exit(7)  # what a segfault or an illegal CUDA access does to pytest: no report at all


def test_after_the_death():
    pass
'''


HANGING = '''\
import time

import pytest

pytestmark = pytest.mark.kernel


def test_that_hangs():
    time.sleep(3600)  # a collective that never completes, a kernel that never ends


def test_after_the_hang():
    pass
'''


BREAKING = '''\
import pytest

pytestmark = pytest.mark.kernel


def test_that_pytest_loses_track_of():
    pass


def test_after_the_internal_error():
    pass
'''

# pytest itself fails mid-session and still prints its summary (pytest-xdist's scheduler
# raising KeyError for a worker it replaced after a crash: INTERNALERROR, exit status 3)
BREAKING_CONFTEST = '''

def pytest_runtest_logreport(report):
    if report.when == "teardown" and report.nodeid.endswith("test_that_pytest_loses_track_of"):
        raise KeyError("<WorkerController gw4>")
'''


def write_suite(root: Path, *, failing: bool, dying: bool = False,
                hanging: bool = False, start_s: float = 0, contract_cases: bool = False,
                breaking: bool = False) -> Path:
    """A suite of fake tests; ``start_s``: seconds its conftest sleeps at import, before
    collection (what importing torch and initialising CUDA cost on a GPU machine);
    ``contract_cases``: a parametrised conformance test besides."""
    t = root / "tests"
    for sub in ("unit", "kernel", "numerics", "multigpu", "misc"):
        (t / sub).mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(PYTEST_INI)
    (t / "conftest.py").write_text(
        (f"import time\ntime.sleep({start_s})\n" if start_s else "") + CONFTEST
        + (BREAKING_CONFTEST if breaking else ""))
    (t / "unit" / "test_u.py").write_text(UNIT)
    (t / "kernel" / "test_k.py").write_text(KERNEL_PASS)
    if failing:
        (t / "kernel" / "test_kfail.py").write_text(KERNEL_FAIL)
    if dying:
        (t / "kernel" / "test_kdies.py").write_text(DYING)
    if hanging:
        (t / "kernel" / "test_khangs.py").write_text(HANGING)
    if breaking:
        (t / "kernel" / "test_kbreaks.py").write_text(BREAKING)
    (t / "numerics" / "test_n.py").write_text(NUMERICS)
    (t / "multigpu" / "test_mg.py").write_text(MULTIGPU)
    (t / "misc" / "test_stray.py").write_text(STRAY)
    if contract_cases:
        (t / "unit" / "test_contract.py").write_text(CONTRACT_CASES)
    return root


def run_with_plugin(suite: Path, *args: str, env: dict | None = None
                    ) -> subprocess.CompletedProcess:
    """pytest on ``suite`` (a directory with its own pytest.ini) in a subprocess, with the suite's
    plugin loaded and this checkout on the path: how validate runs a foreign suite, in small."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ if env is None else env, PYTHONPATH=os.pathsep.join(
        [str(root), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "dcp_a2a.testing.plugin",
         *args], cwd=suite, env=env, capture_output=True, text=True, timeout=300)
