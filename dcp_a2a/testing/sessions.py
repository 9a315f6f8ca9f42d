"""One pytest session of a validation run, watched while it runs: the command (tiers, workers,
the implementation under test), its per-test records as they come (the recorder's JSON lines),
and what is left when it ends badly -- a session that dies names the test it died in, one that
stops reporting for ``--stall-timeout`` seconds is stopped and names the tests that hang, and the
tests it never reached count as not run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .childenv import child_env
from .impl import DEFAULT_SPEC
from .machine import PACKAGE_PARENT, REPO_ROOT, module_present
from .tiers import RunSpec

GPU_WORKERS = 16  # xdist workers on a CUDA machine (at most one a core): each holds a CUDA
# context. Compiling Triton kernels keeps a worker's core busy: with 8 workers on one H200's 16
# cores (2026-12-05) the machine sat at 50% CPU through validate, every worker busy to the end

@dataclass(frozen=True)
class Suite:
    """Where pytest runs (``root``) and what it is given to collect (``args``)."""

    root: Path
    args: tuple
    installed_only: bool = False


def find_suite(suite_dir: Path | None = None) -> Suite:
    """``--suite DIR`` (a directory with tests/ and its own pytest configuration); else the
    checkout this package sits in; else, for an installed package, the shipped conformance
    suite, run from a scratch directory."""
    if suite_dir is not None:
        return Suite(Path(suite_dir).resolve(), ())
    if (REPO_ROOT / "tests" / "conftest.py").is_file():
        return Suite(REPO_ROOT, ())
    import tempfile

    return Suite(Path(tempfile.mkdtemp(prefix="dcp_a2a_validate_")),
                 ("--pyargs", "dcp_a2a.testing.conformance"), installed_only=True)


@dataclass
class RunResult:
    spec: RunSpec
    command: list[str]
    exit_status: int
    wall_s: float
    log: str
    records: list[dict] = field(default_factory=list)
    collection: dict = field(default_factory=dict)
    session: dict = field(default_factory=dict)
    unfinished: list[dict] = field(default_factory=list)  # selected, never started (it died)
    stalled_s: float | None = None  # stopped after this long without a test reporting


DIED = "the pytest process died while this test ran"


UNFINISHED = "not run: the pytest session ended early (it died or was stopped)"


STALL_TIMEOUT_S = 600.0


# Before its tests are collected a session is silent while it imports torch and initialises
# CUDA (seconds on a GPU machine): a --stall-timeout shorter than that counts from collection.
STARTUP_S = 120.0


def running(events: list[dict]) -> list[str]:
    """Node ids that started (the recorder's ``start`` events) and have no result yet."""
    done = {e["nodeid"] for e in events if e.get("event") == "test"}
    return list(dict.fromkeys(e["nodeid"] for e in events
                              if e.get("event") == "start" and e["nodeid"] not in done))


def _lost_record(nodeid: str, phase: str, tiers, duration: float, message: str,
                 text: str) -> dict:
    """A recorder-shaped error record for a test whose session never reported it."""
    return {"event": "test", "nodeid": nodeid, "outcome": "error", "phase": phase,
            "tiers": list(tiers), "markers": [], "duration": duration, "merge_reports": [],
            "message": message, "text": text}


def stalled_record(nodeid: str, stall_s: float, log: str, tiers: list) -> dict:
    why = (f"no test reported for {stall_s:.0f} s (--stall-timeout): validate stopped the "
           "session while this test ran")
    return _lost_record(nodeid, "hang", tiers, stall_s, why,
                        f"{why}; it hangs (a collective that never completes, a kernel that "
                        f"never ends). The session's log: {log}")


def died_records(events: list[dict], exit_status, log: str, tiers_of: dict) -> list[dict]:
    """When a session wrote no session record (its process died: a segfault, os._exit, an
    illegal CUDA access in the code under test), a failure record for each test that started
    and never reported, from the recorder's ``start`` events; [] for a session that ended."""
    if any(e.get("event") == "session" for e in events):
        return []
    why = f"{DIED} (exit status {exit_status})"
    return [_lost_record(n, "crash", tiers_of.get(n, []), 0.0, why,
                         f"{why}: no report, no session record; the session's log has its "
                         f"last output: {log}") for n in running(events)]


def pytest_command(spec: RunSpec, prefix: Path, *, impl: str | None, quick: bool,
                   extra: list[str] = (), suite_args=()) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *suite_args, "-p", "dcp_a2a.testing.plugin",
           "-p", "dcp_a2a.testing.recorder",
           "--dcp-report", str(prefix), "--dcp-tiers", ",".join(spec.tiers),
           "-q", "-rfE", "--color=no"]
    if spec.exclude:
        cmd += ["--dcp-exclude", ",".join(spec.exclude)]
    if quick:
        cmd += ["--dcp-quick"]
    if impl:
        cmd += ["--impl", impl]
        if impl != DEFAULT_SPEC:  # every number then measures the implementation under test
            cmd += ["--dcp-impl-only"]
    return cmd + xdist_args(spec.workers) + list(extra)


def xdist_args(workers) -> list[str]:
    """pytest options for a session spread over ``workers`` pytest-xdist workers (an int or
    ``"auto"``; None or 0: one process). Without xdist installed the session runs in one
    process either way. Every pytest session the harness starts (validate, the self-check)
    takes its worker options from here."""
    if not module_present("xdist"):
        return []
    if workers in (None, 0, "0"):
        return ["-p", "no:xdist"]
    # loadgroup: the tests of one pool of ranks (xdist_group "rank_pool") share a worker
    args = ["-n", str(workers), "--dist", "loadgroup"]
    if module_present("pytest_benchmark"):
        # the suite times nothing (speed is the bench's); under xdist pytest-benchmark, common
        # on GPU images, only warns, once per worker, at the top of the log
        args += ["-p", "no:benchmark"]
    return args


def _read_jsonl(path: Path, offset: int) -> tuple[list[dict], int]:
    """Complete lines appended since ``offset``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    out = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return out, offset + end + 1


def run_pytest(spec: RunSpec, out_dir: Path, *, impl: str | None, quick: bool,
               extra: list[str] = (), progress=None, env: dict | None = None,
               suite: Suite | None = None, stall_s: float = STALL_TIMEOUT_S) -> RunResult:
    """Run one pytest session in a subprocess; ``progress`` (a :class:`Progress`) sees every
    finished test while it runs. A session in which no test starts or ends for ``stall_s``
    seconds after collection (0: never; start-up and collection get ``STARTUP_S`` at least) is
    stopped: the tests running then are failures (they hang), the ones not yet started are
    counted as never run."""
    raw = out_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    prefix = raw / spec.name
    for suffix in (".collection.json", ".results.jsonl"):
        Path(str(prefix) + suffix).unlink(missing_ok=True)
    log_path = out_dir / f"pytest-{spec.name}.log"
    suite = suite or find_suite()
    cmd = pytest_command(spec, prefix, impl=impl, quick=quick, extra=extra,
                         suite_args=suite.args)
    # the session loads this package's plugins (-p dcp_a2a.testing.recorder) from wherever it
    # runs, installed or not; the caller's PYTHONPATH stays behind it
    run_env = child_env(PACKAGE_PARENT, base=os.environ if env is None else env)
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    if impl:
        run_env["DCP_A2A_IMPL"] = impl
    results_path = Path(str(prefix) + ".results.jsonl")
    coll_path = Path(str(prefix) + ".collection.json")
    records: list[dict] = []
    events: list[dict] = []
    session: dict = {}
    collection: dict = {}
    offset = 0
    t0 = last_event = time.monotonic()
    hung: list[str] = []
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=suite.root, env=run_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while True:
                done = proc.poll() is not None
                if not collection and coll_path.is_file():
                    collection = json.loads(coll_path.read_text())
                    last_event = time.monotonic()  # collected: the stall clock starts here
                    if progress:
                        progress.collected(spec, collection)
                new, offset = _read_jsonl(results_path, offset)
                events += new
                if new:
                    last_event = time.monotonic()
                for rec in new:
                    if rec.get("event") == "session":
                        session = rec
                    elif rec.get("event") == "start":
                        continue
                    else:
                        records.append(rec)
                        if progress:
                            progress.test_done(spec, rec)
                if done:
                    break
                silent_s = stall_s if collection else max(stall_s, STARTUP_S)
                if stall_s and not hung and time.monotonic() - last_event > silent_s:
                    hung = running(events) or ["<between tests>"]
                    stall_s = silent_s  # what the report says it waited
                    terminate(proc)
                    continue
                time.sleep(0.2)
        except KeyboardInterrupt:
            terminate(proc)
            raise
    if not collection and coll_path.is_file():
        collection = json.loads(coll_path.read_text())
    selected = {s["nodeid"]: s for s in collection.get("selected", [])}
    tiers_of = {k: v.get("tiers", []) for k, v in selected.items()}
    if hung:  # whatever the stopped session wrote for them, they hung
        records = [r for r in records if r["nodeid"] not in hung]
        records += [stalled_record(n, stall_s, str(log_path), tiers_of.get(n, []))
                    for n in hung if n in selected]
        died = []
    else:
        died = died_records(events, proc.returncode, str(log_path), tiers_of)
    records += died
    for r in records:  # a crashed worker's record (pytest-xdist's) lacks its test's clause
        if not r.get("clause") and (selected.get(r["nodeid"]) or {}).get("clause"):
            r["clause"] = selected[r["nodeid"]]["clause"]
    unfinished = []
    # a session that died, hung, or ended on an internal error (pytest-xdist losing track of a
    # replaced worker, exit status 3, still prints a summary) leaves selected tests unstarted
    if died or hung or not session or proc.returncode not in (0, 1, 5):
        began = {e["nodeid"] for e in events if e.get("nodeid")}
        unfinished = [{"nodeid": k, "tiers": v.get("tiers", []), "markers": v.get("markers", []),
                       "reason": UNFINISHED}
                      for k, v in selected.items() if k not in began]
    return RunResult(spec, cmd, proc.returncode, time.monotonic() - t0, str(log_path),
                     records, collection, session, unfinished, stall_s if hung else None)


def terminate(proc: subprocess.Popen) -> None:
    """Stop the pytest session we started (its own process group: xdist workers, rank pools)."""
    import signal

    for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue

def run_problem(result) -> str | None:
    """Why a pytest session's outcome cannot be trusted as-is, or None."""
    failed = any(r["outcome"] in ("failed", "error") for r in result.records)
    code = result.exit_status
    if getattr(result, "stalled_s", None):
        return (f"stopped: no test reported for {result.stalled_s:.0f} s (a hang; "
                "--stall-timeout)")
    if not result.session and code not in (0, 5):
        return f"the pytest process died (exit status {code}) before the session ended"
    if code == 0 and not failed:
        return None if result.session else "ended without a session record"
    if code == 1 and failed:
        return None
    if code == 5:
        return None  # no tests collected: the tiers say "no tests"
    names = {2: "interrupted", 3: "internal error", 4: "usage error"}
    why = names.get(code, f"exit status {code}")
    if code == 1 and not failed:
        why = "pytest reported a failure that no test record shows"
    if code == 0 and failed:
        why = "pytest reported success but a test record shows a failure"
    return why

