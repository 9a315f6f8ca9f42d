"""Self-check of the validation suite: does the conformance tier catch every shipped bug?

    python -m dcp_a2a.testing.selfcheck [--jobs 2] [--only NAME ...] [--json report.json]

Runs ``pytest -m conformance --impl SPEC -n JOBS`` once per implementation:

* each correct implementation (``dcp_a2a``; ``dcp_a2a.reference.contract``;
  ``dcp_a2a.testing.freedoms``, which takes every freedom the contract leaves; and
  ``dcp_a2a.testing.independent``, written from scratch without the reference's code: the
  guards against tests that fail correct code): every conformance test must pass;
* each mutant in ``dcp_a2a/testing/mutants/`` (one realistic bug per module, its docstring's first line
  names the class of failure): at least one conformance test must fail. Mutant runs stop at
  the first failure (``-x``) and run in one process each (``--mutant-jobs 1``: starting xdist
  workers costs more than the tests a mutant reaches), ``--parallel`` of them at a time.

Prints a kill table (mutant, killed?, first failing test, time) and the wall time of each
correct implementation's full run, and exits non-zero if a mutant survives, a correct
implementation fails, or a run could not be judged (collection errors, timeout): 1; 5 when
nothing was checked (no run selected, or every one needs GPUs this machine lacks). Per-test
outcomes come from the suite's own result recorder (``dcp_a2a.testing.recorder``), so whatever
the conformance tier contains, the first failing test is read from pytest, not from its text
output.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .cores import THREADS_ENV, thread_share
from .validate import died_records, xdist_args

CORRECT = ("dcp_a2a", "dcp_a2a.reference.contract", "dcp_a2a.testing.freedoms",
           "dcp_a2a.testing.independent")
# the correct implementations besides the project's own (which validate judges already)
FOREIGN_CORRECT = CORRECT[1:]
# ... those gpu-check runs on CUDA, where a full conformance run costs about a minute (issue 49:
# gpu-check within 240 s): the two that differ on the GPU (the pure-PyTorch contract, allocating
# under capture, and the one taking every freedom); independent's differences show on the CPU
GPU_CHECK_CORRECT = ("dcp_a2a.reference.contract", "dcp_a2a.testing.freedoms")
MUTANTS_PACKAGE = "dcp_a2a.testing.mutants"
_INTERRUPTED = "no result reported"
_LIVE: set = set()  # pytest processes running now (killed, with their workers, on exit)


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


def discover_mutants(root: Path | None = None) -> list[tuple[str, str]]:
    """[(module spec, one-line description)] of the mutant corpus
    (dcp_a2a/testing/mutants/*.py), sorted by name."""
    out = []
    for f in sorted(MUTANTS_DIR.glob("*.py")):
        if f.name.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(f.read_text())) or ""
        first = doc.strip().splitlines()[0] if doc.strip() else "(no description)"
        out.append((f"{MUTANTS_PACKAGE}.{f.stem}", first))
    return out


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


def _env(root: Path) -> dict:
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(
        [package_parent, str(root)]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_one(spec: str, kind: str, *, root: Path, jobs: int, timeout: float, workdir: Path,
            paths: list[str], marker: str, description: str = "",
            broken: str = "", threads: int | None = None) -> Run:
    run = Run(spec=spec, kind=kind, description=description)
    if kind == "mutant":
        from .rankpool import gpu_count

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
    env = _env(root)
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
    _LIVE.add(proc)
    try:
        proc.wait(timeout=timeout)
        return proc.returncode, False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return proc.returncode, True
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        _LIVE.discard(proc)


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
    from .rankpool import gpu_count

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
    _LIVE.add(proc)
    try:
        proc.join(timeout)
        if proc.exitcode is None:
            _kill_group(proc)
            return None, True
        return proc.exitcode, False
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        _LIVE.discard(proc)


def _kill_group(proc) -> None:
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


def _raise_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def kill_table(runs: list[Run]) -> str:
    """Markdown tables: correct implementations, then the mutants."""
    lines = []
    if any(r.kind == "correct" for r in runs):
        lines += ["| implementation | verdict | passed | failed | skipped | wall time |",
                  "|---|---|---|---|---|---|"]
        for r in runs:
            if r.kind == "correct":
                lines.append(f"| `{r.spec}` | {r.verdict} | {r.passed} | {r.failed} | "
                             f"{r.skipped} | {r.seconds:.1f} s |")
        lines.append("")
    lines += ["| mutant | killed? | first failing test | time | failure class |",
              "|---|---|---|---|---|"]
    for r in runs:
        if r.kind == "mutant":
            name = r.spec.removeprefix(MUTANTS_PACKAGE + ".")
            killed = {"killed": "yes", "SURVIVED": "**NO**",
                      "not run": "not run here"}.get(r.verdict, f"**{r.verdict}**")
            lines.append(f"| `{name}` | {killed} | `{r.first_failure or '-'}` | "
                         f"{r.seconds:.1f} s | {r.description} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dcp_a2a.testing.selfcheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", "-n", type=int, default=2,
                    help="pytest-xdist workers for a correct implementation's run (default 2; "
                         "1 runs without xdist)")
    ap.add_argument("--mutant-jobs", type=int, default=1,
                    help="pytest-xdist workers per mutant run (default 1: no xdist)")
    ap.add_argument("--parallel", type=int, default=2,
                    help="mutant runs at a time (default 2)")
    ap.add_argument("--correct-parallel", type=int, default=1, metavar="K",
                    help="correct implementations' runs at a time, each with --jobs workers "
                         "(default 1: one after the other)")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="run only these mutants (module names) and correct implementations")
    ap.add_argument("--correct", nargs="*", default=list(CORRECT), metavar="SPEC",
                    help=f"correct implementations to run (default: {' '.join(CORRECT)})")
    ap.add_argument("--no-mutants", action="store_true", help="run the correct ones only")
    ap.add_argument("--mutants", nargs="+", metavar="SPEC", dest="mutant_specs",
                    help="judge these implementation specs as mutants instead of the corpus "
                         "(e.g. to check that a suspected bug is caught)")
    ap.add_argument("--paths", nargs="*", default=[str(CONFORMANCE_DIR)],
                    help="test paths handed to pytest (default: the shipped conformance suite)")
    ap.add_argument("--marker", default="conformance", help="pytest -m expression")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds per implementation run before it is killed (default 600)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--workdir", type=Path, help="keep logs and result records here")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = ap.parse_args(argv)

    root = repo_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if args.mutant_specs or args.correct:
        from .impl import importable

        try:  # a file or a module next to the user: module form, importable by every session
            args.mutant_specs = [importable(s) for s in args.mutant_specs or ()] or None
            args.correct = [importable(s) for s in args.correct]
        except ValueError as e:
            ap.error(str(e))
    if args.mutant_specs:
        mutants = [(spec, describe_spec(spec)) for spec in args.mutant_specs]
    else:
        mutants = discover_mutants(root)
    if args.list:
        for spec, desc in mutants:
            print(f"{spec.rsplit('.', 1)[-1]:32s} {desc}")
        return 0
    if args.only:
        wanted = set(args.only)
        unknown = wanted - {s.rsplit(".", 1)[-1] for s, _ in mutants} - set(args.correct)
        if unknown:
            ap.error(f"unknown mutant(s): {', '.join(sorted(unknown))}")
        mutants = [(s, d) for s, d in mutants if s.rsplit(".", 1)[-1] in wanted]
        correct = [c for c in args.correct if c in wanted]
    else:
        correct = list(args.correct)
    if args.no_mutants:
        mutants = []

    from .outpaths import dir_problem, file_problem

    for flag, value, check in (("--workdir", args.workdir, dir_problem),
                               ("--json", args.json, file_problem)):
        why = value is not None and check(value)
        if why:  # before any run: the report is written at the end of all of them
            ap.error(f"{flag} {value}: {why}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dcp_a2a_selfcheck_"))
    workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    common = dict(root=root, timeout=args.timeout, workdir=workdir, paths=args.paths,
                  marker=args.marker)
    total_runs = len(correct) + len(mutants)
    runs: list[Run] = []

    def report(run: Run) -> None:
        runs.append(run)
        print(f"[{len(runs)}/{total_runs}] {run.spec}: {run.verdict} in {run.seconds:.1f} s"
              + (f" ({run.first_failure})" if run.first_failure else ""), flush=True)

    t0 = time.time()
    broken = preflight(correct + [m for m, _ in mutants], root, _env(root))
    # correct implementations before the mutants, --correct-parallel at a time. (Run beside
    # the mutants instead, on one H100 with 16 cores, neither had finished after 245 s, against
    # ~70 s each alone: then every xdist worker still started a pool of 8 ranks of its own,
    # see .poolgroup.)
    at_once = ThreadPoolExecutor(max_workers=max(1, args.correct_parallel))
    try:
        futures = [at_once.submit(run_one, spec, "correct", jobs=args.jobs,
                                  broken=broken.get(spec, ""), **common) for spec in correct]
        for fut in as_completed(futures):
            report(fut.result())
    finally:
        for proc in list(_LIVE):
            _kill_group(proc)
        at_once.shutdown(wait=True, cancel_futures=True)
    pool = ThreadPoolExecutor(max_workers=max(1, args.parallel))
    threads = thread_share(max(1, args.parallel) * max(1, args.mutant_jobs))
    try:
        futures = [pool.submit(run_one, spec, "mutant", jobs=args.mutant_jobs, description=desc,
                               broken=broken.get(spec, ""), threads=threads, **common)
                   for spec, desc in mutants]
        for fut in as_completed(futures):
            report(fut.result())
    finally:  # on an interrupt: end the running pytest sessions, then the threads waiting on them
        for proc in list(_LIVE):
            _kill_group(proc)
        pool.shutdown(wait=True, cancel_futures=True)
    order = {s: i for i, s in enumerate(correct + [m for m, _ in mutants])}
    runs.sort(key=lambda r: order[r.spec])
    total = time.time() - t0

    print()
    print(kill_table(runs))
    bad = [r for r in runs if not r.ok]
    n_mut = sum(r.kind == "mutant" for r in runs)
    n_killed = sum(r.verdict == "killed" for r in runs)
    n_not_run = sum(r.verdict == "not run" for r in runs)
    if n_not_run:
        print(f"\n{n_not_run} mutant(s) not run here: their bug shows only on a GPU "
              "(run the self-check on a GPU machine)")
    print(f"\n{n_killed}/{n_mut} mutants killed; {len(runs) - n_mut} correct implementation(s) "
          f"run; total {total:.1f} s; logs in {workdir}")
    for r in bad:
        print(f"\nPROBLEM {r.spec}: {r.verdict}"
              + (f" — first failure {r.first_failure}: {r.failure_text}" if r.first_failure
                 else "")
              + "".join(f"\n  {n}" for n in r.notes) + f"\n  log: {r.log}")
    checked = [r for r in runs if r.verdict != "not run"]
    if not checked:
        print("\nnothing checked: no run selected, or none this machine can run (exit status 5)")
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], "seconds": total,
                                         "ok": not bad and bool(checked)}, indent=1))
    return 1 if bad else (0 if checked else 5)


if __name__ == "__main__":
    sys.exit(main())
