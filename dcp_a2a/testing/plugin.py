"""pytest plugin of the suite: the implementation under test, devices, the merge check, the
pool of ranks, and the tier markers.

Loaded by ``tests/conftest.py``, by ``dcp-a2a validate``, and for the shipped conformance
suite from any directory with ``-p``:
``pytest -p dcp_a2a.testing.plugin --pyargs dcp_a2a.testing.conformance --impl SPEC`` (pytest
must see the ``--impl`` option before it reads the command line, hence ``-p``). Importing it imports :mod:`dcp_a2a`, which turns Triton's
interpreter on where there is no CUDA (before any kernel is defined).

Options: ``--impl SPEC`` (or ``$DCP_A2A_IMPL``): the implementation under test, see
:mod:`dcp_a2a.testing.impl`. A spec that is empty, cannot be loaded, or has none of the
contract's functions is one usage error at start-up. A test that calls a function the
implementation lacks skips, naming it (``needs(name)`` marks such tests ahead, so tests on a pool
of ranks skip before any rank starts; a call of a missing function anywhere else skips too).
"""

from __future__ import annotations

import os

import pytest
import torch

import dcp_a2a  # noqa: F401  (chooses compiled or interpreted Triton before any kernel exists)

from . import lostcontext, poolgroup, repro
from .cores import THREADS_ENV, thread_share
from .impl import (DEFAULT_SPEC, ENV_VAR, MissingFunction, load_impl,
                   missing_function_message, resolve_spec)
from .surfaces import NOT_APPLICABLE, Unsupported, surfaces_of
from .verdicts import severity_of, severity_of_text

# The parts of the contract a conformance test can check (its ``clause`` marker); a report
# groups failures by them, so an engine author reads divergences by class.
CLAUSES = {
    "wire format": "the send buffer's layout: heads per peer, output lanes bit for bit, the "
                   "fp32 LSE bits in the trailing lanes",
    "merge bound": "the merged output and LSE within the derived bound of the float64 oracle "
                   "(NaN/inf LSEs, zero weights, extremes, determinism)",
    "masking": "rows of empty KV shards and padding rows leave the merge untouched",
    "exchange": "lse_reduce over real process groups (and a group of one): every rank gets the "
                "merge of its heads",
    "bad input": "a clear ValueError/TypeError before any launch or collective",
    "graphs": "buffers under CUDA graphs: capture, regrowth, shared pools, aliasing, streams",
    "caller buffer": "the merged result written into a buffer the caller owns (into=): its "
                     "checks, no allocation for it, nothing else written",
    "up-projection": "MLA's up-projection by W_UV before or after the exchange: both orders "
                     "within the derived bound of the float64 oracle, the switch the right way",
    "envelope": "the inputs the implementation declares it refuses are refused loudly, never "
                "merged into wrong numbers",
}

MARKERS = {
    "unit": "fast pure-host tests (argument checks, reference math on hand-computed cases)",
    "kernel": "Triton kernels against the reference (interpreter on CPU, compiled on CUDA)",
    "multiproc": "real torch.distributed process groups (gloo ranks; on GPU machines the ranks "
                 "compute on the GPUs)",
    "conformance": "contract-level tests that run against any implementation (--impl)",
    "numerics": "error-bound, metamorphic, statistical and determinism tests",
    "gpu": "needs a CUDA GPU; skipped with the reason elsewhere",
    "multigpu": "needs >= 2 CUDA GPUs; skipped with the reason elsewhere",
    "e2e": "end-to-end model accuracy (tiny model in CI; real model by hand)",
    "slow": "long-running; excluded from the quick subset",
    "selfcheck": "runs the conformance tier against every mutant (minutes); not part of any "
                 "validate tier",
    "clause(name)": "the contract clause a conformance test checks: " + ", ".join(CLAUSES),
    "needs(*names)": "contract functions the test calls: it skips on an implementation under "
                     "test that lacks one",
    "surface(*names)": "surfaces of the contract the test needs (dcp_a2a.testing.surfaces), "
                       "instead of its clause's: not applicable where one is not exposed",
    "convention": "what the test checks is a convention (a group of one, the meaning of a "
                  "NaN/+inf LSE): a wrong result there is a difference of convention",
    # pytest-xdist's own marker, registered here too so that runs without xdist (-p no:xdist)
    # still accept it under --strict-markers
    "xdist_group(name)": "tests that must share one xdist worker under --dist loadgroup",
}

# The pool of the multi-process tests: a WORLD of 8 ranks with subgroups of ranks {0,1},
# {0,1,2} and {0..3}, so DCP groups of N = 2, 3, 4 and 8 share one start-up. A collective that a
# peer never joins fails after PG_TIMEOUT_S on the waiting rank; the parent's watchdog
# (TASK_TIMEOUT_S) is the backstop. Both well under any CI cap.
POOL_WORLD = 8
GROUP_SIZES = (2, 3, 4, 8)
PG_TIMEOUT_S = 20.0
TASK_TIMEOUT_S = 60.0


def pytest_addoption(parser):
    parser.addoption(
        "--impl", default=None,
        help="implementation under test: package.module or package.module:attr "
             f"(default: ${ENV_VAR} or {DEFAULT_SPEC}; 'vllm' for the installed vLLM)",
    )


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    # Triton's interpreter runs a kernel's arithmetic in numpy, masked-off lanes included: with
    # the NaN/inf partials the merge tests feed on purpose, the scale * x that the kernel's
    # where() discards warns (0 * inf). Compiled kernels raise nothing.
    config.addinivalue_line(
        "filterwarnings",
        r"ignore:invalid value encountered in multiply:RuntimeWarning:triton\.runtime\.interpreter")
    if not hasattr(config, "workerinput"):  # once, in the controller: a usage error, not N errors
        try:
            spec = load_impl(resolve_spec(config.getoption("--impl"))).spec  # module form
        except ValueError as e:
            raise pytest.UsageError(f"dcp_a2a: {e}") from None
    else:
        spec = os.environ[ENV_VAR]
        share_cores(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    poolgroup.configure(config)
    # a process whose CUDA context the code under test destroyed runs no further test
    if not config.pluginmanager.is_registered(lostcontext):
        config.pluginmanager.register(lostcontext, "dcp_a2a.testing.lostcontext")
    # workers (xdist, the rank pools) inherit the choice through the environment
    os.environ[ENV_VAR] = spec


def share_cores(workers: int) -> None:
    """An xdist worker's share of the cores for torch's CPU ops (:mod:`.cores`), unless the user
    set ``OMP_NUM_THREADS``; set in the environment too, so the processes a test starts (CLI
    runs, rank pools, torchrun) keep to the share."""
    threads = thread_share(workers)
    if threads is not None:
        torch.set_num_threads(threads)
        os.environ[THREADS_ENV] = str(threads)


# The conformance suite runs its cheapest, most discriminating checks first (so that ``-x``, as
# the self-check runs each mutant, stops early): single-process contract tests, then the group of
# 3 ranks, then numerics, then the pools of ranks.
_SUITE_ORDER = ("conformance/test_args", "conformance/test_envelope",
                "conformance/test_wire_format", "conformance/test_merge",
                "conformance/test_caller_buffer", "conformance/test_up_projection",
                "conformance/test_graphs",
                "conformance/test_process_groups", "conformance/test_pack",
                "conformance/test_combine", "conformance/test_group_of_one",
                "conformance/numerics/", "conformance/test_multiproc", "conformance/test_nccl")


def _suite_rank(item) -> int:
    path = str(getattr(item, "path", "")).replace("\\", "/")
    for i, key in enumerate(_SUITE_ORDER):
        if f"dcp_a2a/testing/{key}" in path:
            return i
    return len(_SUITE_ORDER)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the group marks
def pytest_collection_modifyitems(config, items):
    """Order the conformance suite (see _SUITE_ORDER; a stable sort, other tests after it).
    Tests on the pool of ranks share one worker under ``--dist loadgroup``: one pool of 8 ranks
    instead of one per xdist worker (on a GPU machine each rank holds a CUDA context); see
    :mod:`.poolgroup` for why the mark alone no longer does it."""
    items.sort(key=_suite_rank)
    pooled = [item for item in items if "rank_pool" in getattr(item, "fixturenames", ())]
    for item in pooled:
        item.add_marker(pytest.mark.xdist_group(poolgroup.GROUP))
    poolgroup.record(config, pooled)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return poolgroup.make_scheduler(config, log)


def _impl_under_test():
    return load_impl(os.environ[ENV_VAR])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Skip before the test (and any pool of ranks) starts: ``needs(name, ...)`` a function the
    implementation lacks; a surface it does not expose ("not applicable: SURFACE", only for
    tests that take the ``impl`` fixture: the project's own tests judge dcp_a2a). (A process
    whose CUDA context an earlier test destroyed: :mod:`.lostcontext`.)"""
    repro.clear()
    names = [n for m in item.iter_markers("needs") for n in m.args]
    uses_impl = "impl" in getattr(item, "fixturenames", ())
    if names or uses_impl:
        impl = _impl_under_test()
        lacking = [n for n in names if not impl.has(n)]
        if lacking:
            pytest.skip(f"{NOT_APPLICABLE}{', '.join(lacking)} (implementation {impl.spec} "
                        "has no such function)")
        if uses_impl:
            absent = [s for s in surfaces_of(item) if not impl.exposes(s)]
            if absent:
                pytest.skip(f"{NOT_APPLICABLE}{', '.join(absent)} (implementation {impl.spec} "
                            "does not expose it)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each failure of a test of the implementation under test gets its severity
    (:mod:`.verdicts`), its clause and, where the implementation was called in this process,
    a reproducer (:mod:`.repro`), as user properties the report reads."""
    report = yield
    if not report.failed or "impl" not in getattr(item, "fixturenames", ()):
        return report
    if call.excinfo is not None:
        severity, why = severity_of(call.excinfo.value)
    else:
        severity, why = severity_of_text(str(report.longrepr))
    if severity == "defect" and why == "wrong result" and item.get_closest_marker("convention"):
        severity, why = "convention", "convention"
    if severity == "defect" and why == "memory unsafety" and torch.cuda.is_available():
        lostcontext.lost(item.nodeid)
    clause = item.get_closest_marker("clause")
    report.user_properties.append(("severity", {"severity": severity, "why": why}))
    if clause:
        report.user_properties.append(("clause", clause.args[0]))
    calls = repro.calls()
    if calls:
        text = str(call.excinfo.value) if call.excinfo is not None else str(report.longrepr)
        report.user_properties.append(("repro", {
            "script": repro.render(calls, os.environ.get(ENV_VAR, DEFAULT_SPEC), text,
                                   item.nodeid),
            "size": repro.size(calls)}))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A call of a contract function the implementation lacks, in this process or on every
    failed rank of a pool (their tracebacks end in MissingFunction), skips the test."""
    from .rankpool import PoolError

    try:
        return (yield)
    except MissingFunction as e:
        pytest.skip(f"{NOT_APPLICABLE}{e.name} ({e})")
    except Unsupported as e:
        pytest.skip(f"{NOT_APPLICABLE}{e.what}")
    except PoolError as e:
        why = {missing_function_message(tb) for tb in e.tracebacks.values()}
        if e.tracebacks and not e.silent and len(why) == 1 and None not in why:
            pytest.skip(f"{NOT_APPLICABLE}{why.pop()}")
        unsupported = {unsupported_message(tb) for tb in e.tracebacks.values()}
        if e.tracebacks and not e.silent and len(unsupported) == 1 and None not in unsupported:
            pytest.skip(f"{NOT_APPLICABLE}{unsupported.pop()}")
        raise


def unsupported_message(text: str) -> str | None:
    """The message of an :class:`~.surfaces.Unsupported` that ended a rank's traceback."""
    tag = f"{Unsupported.__module__}.{Unsupported.__qualname__}: "
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].split(tag, 1)[1] if lines and tag in lines[-1] else None


@pytest.fixture(scope="session")
def impl():
    """The implementation under test (see dcp_a2a.testing.impl). Contract tests use only this."""
    return _impl_under_test()


@pytest.fixture(scope="session")
def project_only(impl):
    """Skip tests of project-specific extras (backend=, in-process driver) on foreign impls."""
    if not impl.is_project:
        pytest.skip(f"project-specific test; implementation under test is {impl.spec}")


def _devices():
    return ["cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.fixture(params=_devices())
def device(request):
    """Where kernel tests run: the CPU (interpreted Triton) or, on a GPU machine, CUDA."""
    return torch.device(request.param)


def require(impl, *names):
    for n in names:
        if not impl.has(n):
            pytest.skip(f"{NOT_APPLICABLE}{n} (implementation {impl.spec} has no such function)")


@pytest.fixture
def merge_check(request):
    """Compare a merged result with the float64 oracle (dcp_a2a.testing.compare.check_merge),
    fail with the error in ulps and as a ratio to the bound, and record the report on the test
    (with the implementation it measured) so the validation report can show headroom and the
    error distribution of the code under test."""
    from .compare import WEAKER_FORMULATIONS, check_merge, weaker_formulation
    from .verdicts import Precision

    # whose code produced the result: a test that takes the implementation under test measures
    # it; the project's own tests (tests/kernel, ...) measure dcp_a2a whatever --impl says
    subject = os.environ[ENV_VAR] if "impl" in request.fixturenames else DEFAULT_SPEC

    def _check(actual_out, actual_lse, outputs, lses, **kwargs):
        if "is_lse_base_on_e" not in kwargs and "impl" in request.fixturenames:
            # the base the implementation merged in where the test left it to the envelope
            kwargs["is_lse_base_on_e"] = _impl_under_test().envelope.base_e
        rep = check_merge(actual_out, actual_lse, outputs, lses, **kwargs)
        request.node.user_properties.append(("merge_report", rep.as_dict() | {"subject": subject}))
        if not rep.ok:
            form = weaker_formulation(actual_out, actual_lse, outputs, lses, **kwargs)
            if form is not None:  # right numbers, a known less precise design
                raise Precision(f"{rep.describe()}\nweaker precision: {rep.worst_ratio:.3g}x the "
                                f"derived bound, within the bound of a "
                                f"{WEAKER_FORMULATIONS[form]}")
            raise AssertionError(rep.describe())
        return rep

    return _check


@pytest.fixture
def exchange(impl, device):
    """The N-rank exchange of the implementation under test in this process, on the test
    device (see dcp_a2a.testing.exchange)."""
    from .exchange import Exchange

    return Exchange(impl, device)


@pytest.fixture(scope="session")
def rank_pool():
    """One pool of real gloo ranks per test process, started on first use (its ranks compute
    on the GPUs where there are any, else on the CPU through Triton's interpreter). Closed at
    the end of the session; every rank it ever had must then be gone."""
    from .rankpool import pid_alive
    from .tasks import new_pool

    pool = new_pool(POOL_WORLD, subgroup_sizes=[n for n in GROUP_SIZES if n < POOL_WORLD],
                    pg_timeout=PG_TIMEOUT_S, task_timeout=TASK_TIMEOUT_S)
    yield pool
    pool.close()
    left = [p for p in pool.spawned_pids if pid_alive(p)]
    assert not left, f"rank processes left after closing the pool: {left}"


def need_gpus(n: int) -> None:
    """Skip unless this machine has ``n`` CUDA GPUs (an NCCL group needs a GPU per rank)."""
    from .rankpool import gpu_count

    have = gpu_count()
    if have < n:
        pytest.skip(f"needs >= {n} CUDA GPUs for an NCCL group of {n}; this machine has {have}")


@pytest.fixture(scope="module")
def nccl_pool():
    """An NCCL pool of 2 ranks (4 where there are 4 GPUs, with a subgroup of 2)."""
    from .rankpool import RankPool, gpu_count

    need_gpus(2)
    world = 4 if gpu_count() >= 4 else 2
    pool = RankPool(world, backend="nccl", subgroup_sizes=(2,) if world == 4 else (),
                    pg_timeout=60.0, task_timeout=120.0)
    yield pool
    pool.close()
