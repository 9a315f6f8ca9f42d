"""Suite-wide setup: the Triton interpreter on CPU, the implementation under test, devices.

The interpreter must be chosen before any kernel is defined, so it is set here at import time:
on a machine without CUDA every kernel test runs interpreted; with CUDA the same tests run
compiled (set TRITON_INTERPRET=1 yourself to interpret on a GPU machine).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from dcp_a2a.impl import DEFAULT_SPEC, ENV_VAR, load_impl  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--impl", default=None,
        help="implementation under test: package.module or package.module:attr "
             f"(default: ${ENV_VAR} or {DEFAULT_SPEC})",
    )


def pytest_configure(config):
    spec = config.getoption("--impl") or os.environ.get(ENV_VAR) or DEFAULT_SPEC
    # workers (xdist, the process pool) inherit the choice through the environment
    os.environ[ENV_VAR] = spec


@pytest.fixture(scope="session")
def impl():
    """The implementation under test (see dcp_a2a.impl). Contract tests use only this."""
    return load_impl(os.environ[ENV_VAR])


@pytest.fixture(scope="session")
def project_only(impl):
    """Skip tests of project-specific extras (backend=, in-process driver) on foreign impls."""
    if not impl.is_project:
        pytest.skip(f"project-specific test; implementation under test is {impl.spec}")


def _devices():
    devs = ["cpu"] if not torch.cuda.is_available() else ["cuda"]
    return devs


@pytest.fixture(params=_devices())
def device(request):
    """Where kernel tests run: the CPU (interpreted Triton) or, on a GPU machine, CUDA."""
    return torch.device(request.param)


def require(impl, *names):
    for n in names:
        if not impl.has(n):
            pytest.skip(f"implementation {impl.spec} has no {n}")


@pytest.fixture
def merge_check(request):
    """Compare a merged result with the float64 oracle (dcp_a2a.compare.check_merge), fail with
    the error in ulps and as a ratio to the bound, and record the report on the test so the
    validation report can show headroom and the error distribution."""
    from dcp_a2a.compare import check_merge

    def _check(actual_out, actual_lse, outputs, lses, **kwargs):
        rep = check_merge(actual_out, actual_lse, outputs, lses, **kwargs)
        request.node.user_properties.append(("merge_report", rep.as_dict()))
        if not rep.ok:
            raise AssertionError(rep.describe())
        return rep

    return _check


_PROBE = '''
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl

@triton.jit
def fill(x, n, BLOCK: tl.constexpr):
    for i in range(0, n, BLOCK):
        tl.store(x + i + tl.arange(0, BLOCK), 1.0)

x = torch.zeros(8)
fill[(1,)](x, 8, BLOCK=4)
assert float(x.sum()) == 8.0
'''


def _cpu_interpreter_problem() -> str | None:
    """On a GPU machine the CPU (gloo) ranks run Triton's interpreter while the rest of the suite
    runs compiled; some Triton builds' interpreters cannot run a loop with a run-time bound
    (Triton 3.6 with numpy 2.x: 'only 0-dimensional arrays can be converted to Python
    scalars'). Probe it once in a subprocess; None when it works."""
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_PROBE)
    try:
        r = subprocess.run([sys.executable, f.name], capture_output=True, text=True, timeout=180)
    finally:
        os.unlink(f.name)
    if r.returncode == 0:
        return None
    last = (r.stderr.strip().splitlines() or ["exit code %d" % r.returncode])[-1]
    return last


def pytest_collection_modifyitems(config, items):
    """CPU-rank tests (gloo groups: marker multiproc without multigpu, or the `cpu_ranks`
    marker) need Triton's interpreter; on a GPU machine whose Triton interpreter fails the probe,
    they skip with the reason. On a machine without CUDA they always run (everything is
    interpreted there, so an interpreter problem fails the whole suite visibly)."""
    if not torch.cuda.is_available():
        return
    wanted = [i for i in items
              if ("multiproc" in i.keywords and "multigpu" not in i.keywords)
              or "cpu_ranks" in i.keywords]
    if not wanted:
        return
    problem = _cpu_interpreter_problem()
    if problem is None:
        return
    import triton

    skip = pytest.mark.skip(reason=f"CPU (gloo) ranks need Triton's interpreter, and this "
                                   f"Triton {triton.__version__}'s fails a run-time loop bound: "
                                   f"{problem}; run this tier on a machine without CUDA (CI)")
    for item in wanted:
        item.add_marker(skip)
