"""One conformance run of the self-check: ``pytest -m conformance --impl SPEC`` against one
implementation, and its verdict.

A correct implementation must pass every test ("pass"; a failure is "FAIL"); a mutant must fail
at least one ("killed"; none is "SURVIVED"). A run that cannot be judged -- collection errors,
a timeout, a mutant that cannot even be loaded or that crashes inside its own code -- is
"error", never a kill. Per-test outcomes come from the suite's own result recorder
(``dcp_a2a.testing.recorder``), so the first failing test is read from pytest, not from its
text output; a session that died in a test (no session record) failed that test.

Mutant runs stop at the first failure (``-x``). On a machine without GPUs a run's pytest session
is a fork of one server that imported torch, Triton and the suite once (:func:`_pytest_forked`);
with GPUs each run is a fresh subprocess with its own CUDA context.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cores import THREADS_ENV
from .sessions import died_records, xdist_args

_INTERRUPTED = "no result reported"
LIVE: set = set()  # pytest processes running now (killed, with their workers, on exit)


@dataclass
class Run:
    spec: str
    kind: str                    # "correct" or "mutant"
    description: str = ""
    verdict: str = ""            # correct: pass/FAIL/error; mutant: killed/SURVIVED/error
    first_failure: str = ""      # node id of the first failing test
    failure_text: str = ""       # its message, shortened
    failure_text_full: str = field(default="", repr=False)
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    collect_errors: int = 0
    exitstatus: int | None = None
    seconds: float = 0.0
    log: str = ""
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict in ("pass", "killed", "not run")


CONFORMANCE_DIR = Path(__file__).resolve().parent / "conformance"


MUTANTS_DIR = Path(__file__).resolve().parent / "mutants"


def repo_root() -> Path:
    """Where the pytest sessions run: the checkout this package sits in when there is one (its
    pytest configuration then applies), else the working directory."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "tests" / "conftest.py").is_file() else Path.cwd()


def needs_gpus(spec: str) -> int:
    """The mutant's ``NEEDS_GPUS = k`` (module level; 0 when absent): its bug shows only under
    CUDA graphs or NCCL, so it is judged only where k GPUs are visible. Read without importing."""
    import importlib.util

    try:
        found = importlib.util.find_spec(spec.partition(":")[0])
    except (ImportError, ValueError):
        return 0
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return 0
    for node in ast.parse(Path(found.origin).read_text()).body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NEEDS_GPUS"
                                                 for t in node.targets)
                and isinstance(node.value, ast.Constant)):
            return int(node.value.value)
    return 0


def describe_spec(spec: str) -> str:
    """First docstring line of the module behind ``spec`` (found without importing it)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(spec.partition(":")[0])
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return "(not found)"
    doc = ast.get_docstring(ast.parse(Path(found.origin).read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else "(no description)"


_PREFLIGHT = r"""
import json, sys
from dcp_a2a.testing.impl import load_impl
res = {}
for spec in sys.argv[1:]:
    try:
        missing = load_impl(spec).missing()
        res[spec] = f"missing {', '.join(missing)}" if missing else ""
    except Exception as e:
        res[spec] = f"{type(e).__name__}: {e}"
print(json.dumps(res))
"""


def preflight(specs: list[str], root: Path, env: dict) -> dict[str, str]:
    """{spec: problem} for implementations that cannot even be loaded (one subprocess for all:
    a mutant may patch the project at import, which must not touch this process). A mutant that
    fails to load would otherwise fail every test and pass for "killed"."""
    if not specs:
        return {}
    proc = subprocess.run([sys.executable, "-c", _PREFLIGHT, *specs], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    try:
        res = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {s: f"preflight failed: {proc.stderr.strip()[-500:]}" for s in specs}
    return {s: msg for s, msg in res.items() if msg}


# A traceback that ends inside the mutant with one of these is the mutant crashing (stale
# against the project code it wraps), not the suite catching its bug.
_MUTANT_CRASH = re.compile(r"mutants/\w+\.py:\d+: (AttributeError|NameError|ImportError|"
                           r"ModuleNotFoundError|SyntaxError)")


def _short(text: str, limit: int = 300) -> str:
    """The most telling line of a failure report: the last 'E   ' line, else the last line."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errs = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    pick = errs[0] if errs else (lines[-1].strip() if lines else "")
    return pick[:limit]


def _read_results(path: Path, run: Run, returncode=None, timed_out: bool = False) -> None:
    """Fold a session's records into ``run``. A process that died in a test (no session record;
    not the self-check's own timeout) failed that test: an implementation that crashes the
    process is caught by it."""
    if not path.is_file():
        run.notes.append("pytest wrote no result records")
        return
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if not timed_out:
        events += died_records(events, returncode, run.log, {})
    for rec in events:
        if rec.get("event") == "session":
            run.exitstatus = rec.get("exitstatus")
            continue
        if rec.get("event") == "start":
            continue
        outcome, phase = rec.get("outcome"), rec.get("phase")
        if outcome in ("passed", "xpassed", "xfailed"):
            run.passed += 1
        elif outcome == "skipped":
            run.skipped += 1
        elif outcome in ("failed", "error"):
            if phase == "collect":
                run.collect_errors += 1
                run.notes.append(f"collection error in {rec.get('nodeid')}: "
                                 f"{_short(rec.get('text', ''))}")
            elif phase is None or _INTERRUPTED in rec.get("text", ""):
                continue  # in flight when -x stopped the session: no verdict
            else:
                run.failed += 1
                if not run.first_failure:
                    run.first_failure = rec.get("nodeid", "?")
                    run.failure_text = _short(rec.get("text", ""))
                    run.failure_text_full = rec.get("text", "")


def child_env(root: Path) -> dict:
    """A run's environment: this package and the checkout first on PYTHONPATH, then the
    caller's entries (an implementation found through them is found in the run too)."""
    from .childenv import child_env as env_with

    return env_with(Path(__file__).resolve().parents[2], root)


def run_one(spec: str, kind: str, *, root: Path, jobs: int, timeout: float, workdir: Path,
            paths: list[str], marker: str, description: str = "",
            broken: str = "", threads: int | None = None) -> Run:
    run = Run(spec=spec, kind=kind, description=description)
    if kind == "mutant":
        from .devices import gpu_count

        need, have = needs_gpus(spec), gpu_count()
        if need > have:
            run.verdict = "not run"
            run.notes.append(f"needs {need} CUDA GPU(s) (its bug shows under CUDA graphs); "
                             f"this machine has {have}")
            return run
    if broken:
        run.verdict = "error"
        run.notes.append(f"cannot be loaded: {broken}")
        return run
    prefix = workdir / spec.replace(".", "_")
    log = Path(str(prefix) + ".log")
    cmd = [sys.executable, "-m", "pytest", "-m", marker, "--impl", spec, "-q",
           "-p", "no:cacheprovider", "-p", "dcp_a2a.testing.recorder",
           "--dcp-report", str(prefix), "--continue-on-collection-errors"]
    cmd += xdist_args(jobs if jobs > 1 else None)
    if kind == "mutant":
        # -x: the first failure is the verdict. Without the plugins that turn exceptions raised
        # in __del__ or in threads into warnings (warnings fail no test here), whose
        # end-of-session garbage collections were a quarter of a quickly killed mutant's run.
        cmd += ["-x", "-p", "no:unraisableexception", "-p", "no:threadexception"]
    cmd += paths
    env = child_env(root)
    env["DCP_A2A_IMPL"] = spec
    if threads is not None:  # torch's share of the cores beside the other runs at once
        env[THREADS_ENV] = str(threads)
    t0 = time.time()
    with open(log, "w") as fh:
        fh.write(" ".join(cmd) + "\n")
    if jobs == 1 and _forkable():
        returncode, timed_out = _pytest_forked(cmd[3:], root, env, log, timeout)
    else:
        returncode, timed_out = _pytest_subprocess(cmd, root, env, log, timeout)
    if timed_out:
        run.notes.append(f"timed out after {timeout:.0f} s")
    run.seconds = time.time() - t0
    run.log = str(log)
    _read_results(Path(str(prefix) + ".results.jsonl"), run, returncode, timed_out)
    if run.exitstatus is None:
        run.exitstatus = returncode
    timed_out = any(n.startswith("timed out") for n in run.notes)
    if kind == "correct":
        if timed_out or run.collect_errors:
            run.verdict = "error"
        elif run.failed or run.exitstatus not in (0,) or run.passed == 0:
            run.verdict = "FAIL"
            if run.passed == 0 and not run.failed:
                run.notes.append("no conformance test passed (none collected?)")
        else:
            run.verdict = "pass"
    else:
        if run.failed and _MUTANT_CRASH.search(run.failure_text_full):
            run.verdict = "error"
            run.notes.append("the mutant itself crashed: " + run.failure_text)
        elif run.failed:
            run.verdict = "killed"
        elif timed_out or run.collect_errors or run.exitstatus not in (0, 1, 5):
            run.verdict = "error"
            if not run.notes:
                run.notes.append(f"pytest exit status {run.exitstatus}; see {log}")
        else:
            run.verdict = "SURVIVED"
    return run


def _pytest_subprocess(cmd, root, env, log, timeout) -> tuple[int | None, bool]:
    with open(log, "a") as fh:
        # its own session, so that a timeout or an interrupt ends pytest and all its workers
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    LIVE.add(proc)
    try:
        proc.wait(timeout=timeout)
        return proc.returncode, False
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return proc.returncode, True
    except BaseException:
        kill_group(proc)
        raise
    finally:
        LIVE.discard(proc)


# A mutant's run is a few seconds of tests after ~8 s of start-up (torch, Triton, pytest,
# collection). On a machine without GPUs its pytest session is a fork of one server that has
# imported all that once: the self-check's CPU time drops by about half. (With GPUs each run
# needs its own CUDA context: fresh subprocesses.) Whatever collection imports belongs here:
# scipy.stats (the statistics tests) left out cost each run ~1 s, the CPU self-check 45 -> 36 s.
_PRELOAD = ["torch", "torch.distributed", "numpy", "scipy.special", "scipy.stats", "triton",
            "pytest", "hypothesis", "filelock", "yaml", "dcp_a2a", "dcp_a2a.testing.plugin",
            "dcp_a2a.testing.recorder", "dcp_a2a.testing.compare", "dcp_a2a.testing.exchange",
            "dcp_a2a.testing.tasks", "dcp_a2a.reference.contract", "dcp_a2a.testing.freedoms",
            "dcp_a2a.testing.independent"]


def _forkable() -> bool:
    from .devices import gpu_count

    return gpu_count() == 0


def _pytest_child(args, cwd, env, log) -> None:
    os.setsid()  # a session of its own: a timeout kills it with everything it started
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if THREADS_ENV in env:  # torch was imported before the fork, with the server's environment
        import torch

        torch.set_num_threads(int(env[THREADS_ENV]))
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 3
    try:
        import pytest

        code = int(pytest.main(list(args)))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _pytest_forked(args, root, env, log, timeout) -> tuple[int | None, bool]:
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    proc = ctx.Process(target=_pytest_child, args=(list(args), str(root), env, str(log)))
    proc.start()
    LIVE.add(proc)
    try:
        proc.join(timeout)
        if proc.exitcode is None:
            kill_group(proc)
            return None, True
        return proc.exitcode, False
    except BaseException:
        kill_group(proc)
        raise
    finally:
        LIVE.discard(proc)


def kill_group(proc) -> None:
    """Kill a pytest session (a subprocess or a forked one) and everything it started."""
    pid = proc.pid
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if isinstance(proc, subprocess.Popen):
        proc.wait()
    else:
        proc.join(10)

