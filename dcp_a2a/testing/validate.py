"""``dcp-a2a validate``: find out what this machine can run, run those tiers, summarise.

The tiers are the pytest markers of the suite (see ``tests/``): unit, kernel, multiproc,
conformance, numerics (always), gpu (a CUDA device), multigpu (>= 2 CUDA devices), e2e (asked for
with ``--evals``; then also the model-level jobs ``python -m dcp_a2a.evals.logit_parity`` and
``python -m dcp_a2a.evals.gsm8k`` when their code, the model and the data are present).

The suite: in a source checkout, the project's ``tests/`` and the conformance suite shipped in
the package (the ``testpaths`` of pyproject.toml); with only an installed package, the shipped
conformance suite (``pytest --pyargs dcp_a2a.testing.conformance``).

How tests are attributed to tiers (also in docs/validate.md):

* A test belongs to every tier whose marker it carries, or to its ``tests/<tier>/`` directory
  when it carries none. Each selected test runs ONCE; a kernel + conformance test counts in both
  rows, so the rows' case counts may add up to more than the total line (which counts tests).
* Tiers are run together in one pytest session (one xdist start-up, no test re-run); only the
  multigpu tier gets its own session, without xdist, so NCCL jobs do not fight over the GPUs.
* A test carrying the marker of a tier that cannot run here (gpu on a CPU machine) or that was not
  asked for (e2e without --evals) is not run, whatever other tiers it is in; it is counted in that
  tier's "not run" column.

Per-tier status: ``passed`` (something passed, nothing failed), ``failed`` (a failure or error),
``skipped`` (every test skipped itself), ``no tests`` (nothing collected), ``not run`` (the tier
cannot run here, or was not asked for: ``reason`` says which).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .impl import DEFAULT_SPEC

TIERS = ("unit", "kernel", "multiproc", "conformance", "numerics", "gpu", "multigpu", "e2e")
CPU_TIERS = ("unit", "kernel", "multiproc", "conformance", "numerics")
# tiers whose tests need something this machine may lack; their tests never run elsewhere
GATED_TIERS = ("gpu", "multigpu", "e2e")
# the quick subset: unit, kernel and conformance; a test also marked multiproc (spawning ranks) or
# numerics (statistics, large batches, hypothesis) is left out; slow tests dropped; one case per
# test function of the project's own tests, every case of a conformance test (the recorder)
QUICK_TIERS = ("unit", "kernel", "conformance")
QUICK_OUT_REASON = "not in the quick subset"
# why a test is left out under a foreign --impl (the recorder's --dcp-impl-only)
OTHER_CODE = "other code: tests dcp_a2a's own code, not the implementation under test"

PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the directory holding dcp_a2a/
REPO_ROOT = PACKAGE_PARENT                             # ... which is the checkout, if any
GSM8K_ENV = "DCP_A2A_GSM8K_DIR"
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


def default_gsm8k_dir() -> Path:
    env = os.environ.get(GSM8K_ENV)
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "data" / "gsm8k")


# --------------------------------------------------------------------------- machine detection

def prepared_eval_models() -> list[tuple[str, Path]]:
    """[(name, GGUF path)] of the registered eval models that ``python -m
    dcp_a2a.evals.prepare`` has prepared here, strongest first; found without loading any."""
    try:
        from dcp_a2a.evals import model as em
    except ImportError:
        return []
    return em.prepared_models()


def find_eval_model(name: str | None = None) -> tuple[str | None, Path | None]:
    """(name, GGUF) of the eval model: ``name`` if given (its GGUF, or None when it is not
    prepared), else the strongest prepared one (None, None when there is none)."""
    prepared = prepared_eval_models()
    if name is None:
        return prepared[0] if prepared else (None, None)
    return name, dict(prepared).get(name)


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _git_commit() -> str | None:
    if os.environ.get("DCP_A2A_COMMIT"):  # a copy of a checkout without its own history
        return os.environ["DCP_A2A_COMMIT"][:7]
    if not (REPO_ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def detect_machine(gsm8k_dir: Path | None = None, eval_model: str | None = None) -> dict:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except Exception as e:  # noqa: BLE001 - report, don't die
        triton_version = f"unavailable ({type(e).__name__})"
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = []
    for i in range(n_gpu):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                     "capability": f"{p.major}.{p.minor}"})
    dist = {"available": torch.distributed.is_available()}
    if dist["available"]:
        dist["gloo"] = torch.distributed.is_gloo_available()
        dist["nccl"] = torch.distributed.is_nccl_available()
    gsm8k_dir = Path(gsm8k_dir) if gsm8k_dir else default_gsm8k_dir()
    model_name, model = find_eval_model(eval_model)
    interp = os.environ.get("TRITON_INTERPRET", "")
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "TRITON_INTERPRET": interp or None,
        "triton_mode": "interpreter" if interp not in ("", "0") else "compiled",
        "cuda_device_count": n_gpu,
        "gpus": gpus,
        "device": gpus[0]["name"] if gpus else "cpu",
        "distributed": dist,
        "eval_model": str(model) if model else None,
        "eval_model_name": model_name,
        "gsm8k_dir": str(gsm8k_dir),
        "gsm8k_present": (gsm8k_dir / "test.jsonl").is_file(),
        "modules": {m: _module_present(m) for m in (
            "xdist", "matplotlib", "transformers", "gguf", "accelerate", "lm_eval",
            "dcp_a2a.evals.logit_parity", "dcp_a2a.evals.gsm8k")},
        "git_commit": _git_commit(),
    }


# --------------------------------------------------------------------------- planning

@dataclass
class TierPlan:
    name: str
    run: bool
    reason: str | None = None  # why it does not run


def tier_availability(machine: dict, evals: bool) -> dict[str, str | None]:
    """tier -> None if it can run here, else the reason it cannot."""
    n = machine["cuda_device_count"]
    dist = machine["distributed"]
    why: dict[str, str | None] = {t: None for t in TIERS}
    if not dist.get("available") or not (dist.get("gloo") or dist.get("nccl")):
        why["multiproc"] = "torch.distributed has no gloo/nccl backend in this torch build"
    if n == 0:
        cpu_build = machine["torch_cuda"] is None
        why["gpu"] = ("no CUDA GPU (torch %s is a CPU build)" % machine["torch"] if cpu_build
                      else "no CUDA GPU visible (torch.cuda.device_count() == 0)")
    if n < 2:
        why["multigpu"] = f"needs >= 2 CUDA GPUs, found {n}"
    if n and machine.get("triton_mode") == "interpreter":
        # the GPU tiers judge compiled kernels (rounding, contraction, timing): the
        # interpreter would pass them without compiling anything
        for t in ("gpu", "multigpu"):
            why[t] = why[t] or (f"TRITON_INTERPRET={machine.get('TRITON_INTERPRET')} runs "
                                "Triton's interpreter, not the compiled kernels this tier "
                                "checks (unset TRITON_INTERPRET)")
    if not evals:
        why["e2e"] = "not requested (pass --evals)"
    return why


def plan_tiers(machine: dict, requested: list[str] | None, evals: bool,
               quick: bool = False) -> list[TierPlan]:
    why = tier_availability(machine, evals)
    if requested is None:
        requested = [t for t in (QUICK_TIERS if quick else TIERS)]
        if quick:
            for t in TIERS:
                if t not in requested and why[t] is None and t != "e2e":
                    why[t] = QUICK_OUT_REASON
    plans = []
    for t in TIERS:
        if t not in requested:
            plans.append(TierPlan(t, False, why[t] or "not selected (--tiers)"))
        else:
            plans.append(TierPlan(t, why[t] is None, why[t]))
    return plans


@dataclass
class RunSpec:
    """One pytest session."""
    name: str
    tiers: list[str]
    exclude: list[str]
    workers: str | int | None  # None: no xdist


def plan_runs(plans: list[TierPlan], workers: str | int | None) -> list[RunSpec]:
    run = [p.name for p in plans if p.run]
    # tests of these tiers never run in this job, whatever other tier they are also in
    blocked = [p.name for p in plans if not p.run and (
        p.name in GATED_TIERS or p.reason == QUICK_OUT_REASON)]
    runs = []
    main = [t for t in run if t != "multigpu"]
    if main:
        runs.append(RunSpec("main", main, sorted(set(blocked) | ({"multigpu"} & set(run))),
                            workers))
    if "multigpu" in run:
        runs.append(RunSpec("multigpu", ["multigpu"], sorted(set(blocked)), None))
    return runs


# --------------------------------------------------------------------------- running pytest

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
    if not _module_present("xdist"):
        return []
    if workers in (None, 0, "0"):
        return ["-p", "no:xdist"]
    # loadgroup: the tests of one pool of ranks (xdist_group "rank_pool") share a worker
    args = ["-n", str(workers), "--dist", "loadgroup"]
    if _module_present("pytest_benchmark"):
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
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    # the session loads this package's plugins (-p dcp_a2a.testing.recorder) from wherever it
    # runs, installed or not
    run_env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_PARENT)] + [p for p in run_env.get("PYTHONPATH", "").split(os.pathsep) if p])
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
                    _terminate(proc)
                    continue
                time.sleep(0.2)
        except KeyboardInterrupt:
            _terminate(proc)
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
    unfinished = []
    if died or hung or not session:
        began = {e["nodeid"] for e in events if e.get("nodeid")}
        unfinished = [{"nodeid": k, "tiers": v.get("tiers", []), "markers": v.get("markers", []),
                       "reason": UNFINISHED}
                      for k, v in selected.items() if k not in began]
    return RunResult(spec, cmd, proc.returncode, time.monotonic() - t0, str(log_path),
                     records, collection, session, unfinished, stall_s if hung else None)


def _terminate(proc: subprocess.Popen) -> None:
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


# --------------------------------------------------------------------------- evals (--evals)

@dataclass
class EvalJob:
    name: str
    module: str
    status: str = "not run"   # passed / failed / not run
    reason: str | None = None
    command: list[str] = field(default_factory=list)
    exit_status: int | None = None
    wall_s: float = 0.0
    log: str | None = None
    result_file: str | None = None
    result: dict | None = None


def _supported_options(module: str, wanted: list[str]) -> list[str] | None:
    """Which of ``wanted`` the job's ``--help`` mentions (None if --help itself fails): the eval
    drivers are separate programs, so validate only passes options they declare."""
    try:
        out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return [w for w in wanted if w in out.stdout]


def _not_installed(names: list[str]) -> str:
    verb = "is" if len(names) == 1 else "are"
    return f"{', '.join(names)} {verb} not installed (pip install -e '.[evals]')"


def plan_evals(machine: dict, out_dir: Path, gsm8k_limit: int, gsm8k_backends: str,
               impl: str | None = None) -> list[EvalJob]:
    """Logit parity and the GSM8K subset, each with the true reason if it cannot run here (the
    first missing thing, named exactly). Each job writes into ``DIR/evals/<job>/`` (its
    ``--out``); its ``results.json`` (or first JSON file) becomes ``result`` in the report.

    The evals put dcp_a2a's own combine inside a model: under another ``--impl`` they would
    measure dcp_a2a, not the implementation under test, so they do not run."""
    model = machine["eval_model"]
    name = machine.get("eval_model_name")
    mods = machine["modules"]
    ev = out_dir / "evals"
    lp = EvalJob("logit_parity", "dcp_a2a.evals.logit_parity")
    gs = EvalJob("gsm8k", "dcp_a2a.evals.gsm8k")
    for job, needs in ((lp, ("transformers", "gguf", "accelerate")),
                       (gs, ("transformers", "gguf", "accelerate", "lm_eval"))):
        absent = [m.replace("_", "-") for m in needs if not mods.get(m)]
        if impl not in (None, DEFAULT_SPEC):
            job.reason = (f"the evals run dcp_a2a's own combine inside a model; they cannot "
                          f"measure --impl {impl}")
        elif not mods.get(job.module):
            job.reason = f"{job.module} is not in this installation"
        elif absent:
            job.reason = _not_installed(absent)
        elif model is None:
            job.reason = (f"eval model {name} is not prepared (python -m dcp_a2a.evals.prepare "
                          f"--model {name})" if name else
                          "no eval model is prepared (python -m dcp_a2a.evals.prepare "
                          "--model NAME; docs/evals.md lists them)")
        elif not machine["gsm8k_present"]:
            job.reason = (f"GSM8K data not found at {machine['gsm8k_dir']} (test.jsonl; "
                          f"--gsm8k-dir or ${GSM8K_ENV})")
    values = {"--out": None, "--gsm8k-dir": machine["gsm8k_dir"], "--limit": str(gsm8k_limit),
              "--backends": gsm8k_backends, "--model": name}
    for job, wanted in ((lp, ["--out", "--gsm8k-dir", "--model"]),
                        (gs, ["--out", "--gsm8k-dir", "--limit", "--backends", "--model"])):
        if job.reason is not None:
            continue
        opts = _supported_options(job.module, wanted)
        if opts is None:
            job.reason = f"python -m {job.module} --help failed"
            continue
        job.command = [sys.executable, "-m", job.module]
        for o in opts:
            job.command += [o, str(ev / job.name) if o == "--out" else values[o]]
        job.result_file = str(ev / job.name) if "--out" in opts else None
    return [lp, gs]


def run_eval(job: EvalJob, out_dir: Path, progress=None) -> EvalJob:
    if job.reason is not None:
        return job
    (out_dir / "evals").mkdir(parents=True, exist_ok=True)
    job.log = str(out_dir / "evals" / f"{job.name}.log")
    if progress:
        progress.message(f"running {job.name}: {' '.join(job.command[1:])}")
    t0 = time.monotonic()
    with open(job.log, "w") as log:
        log.write("$ " + " ".join(job.command) + "\n")
        log.flush()
        proc = subprocess.Popen(job.command, cwd=REPO_ROOT, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait()
        except KeyboardInterrupt:
            _terminate(proc)
            raise
    job.wall_s = time.monotonic() - t0
    job.exit_status = proc.returncode
    job.status = "passed" if proc.returncode == 0 else "failed"
    if job.status == "failed":  # the report names why, and links the log, not a result
        job.reason = _last_error_line(Path(job.log)) or f"exit status {proc.returncode}"
    if job.result_file:
        res = Path(job.result_file)
        if res.is_dir():
            found = [res / "results.json"] if (res / "results.json").is_file() else sorted(
                res.glob("*.json"))
            res = found[0] if found else res
        if res.is_file():
            job.result_file = str(res)
            try:
                job.result = json.loads(res.read_text())
            except ValueError:
                job.result = None
        else:
            job.result_file = None  # nothing was written there: link nothing
    return job


def _last_error_line(log: Path) -> str | None:
    """The line of a failed job's log that says why: its last 'error'/'Error' line, else its
    last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    errs = [ln for ln in lines if "error" in ln.lower()]
    pick = errs[-1] if errs else (lines[-1] if lines else None)
    return pick[:300] if pick else None


# --------------------------------------------------------------------------- summarising

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


@dataclass
class TierSummary:
    name: str
    status: str
    reason: str | None = None
    cases: int = 0
    passed: int = 0
    failed: int = 0       # failures + errors + xpassed-strict are all counted here
    errors: int = 0
    skipped: int = 0
    xfailed: int = 0
    xpassed: int = 0
    not_run: int = 0      # collected, but the tier (or another gated tier of the test) can't run
    left_out: int = 0     # dropped by --quick
    other_code: int = 0   # tests of dcp_a2a's own code, left out under a foreign --impl
    unfinished: int = 0   # selected, but the pytest session died before them
    time_s: float = 0.0   # sum of the tier's test durations (setup + call + teardown)
    merge_checks: int = 0
    worst_ratio: float | None = None
    headroom: float | None = None
    worst_case: dict | None = None
    skip_reasons: dict = field(default_factory=dict)
    xfail_reasons: dict = field(default_factory=dict)


def headroom(ratio: float | None) -> float | None:
    if ratio is None:
        return None
    if ratio == 0:
        return math.inf
    return 1.0 / ratio if math.isfinite(ratio) else 0.0


def _ratio(v) -> float:
    if isinstance(v, str):
        return float(v)
    return math.inf if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def measures(m: dict, subject: str | None) -> bool:
    """Whether a merge report measured ``subject`` (the implementation under test; None: any)."""
    return subject is None or m.get("subject", DEFAULT_SPEC) == subject


def summarise_tiers(plans: list[TierPlan], records: list[dict],
                    dropped: list[dict], subject: str | None = None) -> list[TierSummary]:
    """Per-tier counts from the per-test records (see :mod:`dcp_a2a.testing.recorder`); the
    error over the bound only from merge checks of ``subject``'s code."""
    out = []
    for p in plans:
        s = TierSummary(p.name, "not run", p.reason)
        for d in dropped:
            if p.name in d["tiers"]:
                if d["reason"].startswith("quick"):
                    s.left_out += 1
                elif d["reason"] == OTHER_CODE:
                    s.other_code += 1
                elif d["reason"] == UNFINISHED:
                    s.unfinished += 1
                else:
                    s.not_run += 1
        for r in records:
            if not p.run or p.name not in r.get("tiers", ()):
                continue
            s.cases += 1
            oc = r["outcome"]
            if oc == "passed":
                s.passed += 1
            elif oc == "failed":
                s.failed += 1
            elif oc == "error":
                s.failed += 1
                s.errors += 1
            elif oc == "skipped":
                s.skipped += 1
                reason = (r.get("text") or "").strip().splitlines()[:1]
                key = reason[0][:200] if reason else "(no reason)"
                s.skip_reasons[key] = s.skip_reasons.get(key, 0) + 1
            elif oc == "xfailed":
                s.xfailed += 1
                reason = (r.get("text") or "").strip().splitlines()[:1]
                key = reason[0][:200] if reason else "(no reason)"
                s.xfail_reasons[key] = s.xfail_reasons.get(key, 0) + 1
            elif oc == "xpassed":
                s.xpassed += 1
            s.time_s += float(r.get("duration") or 0.0)
            for m in r.get("merge_reports") or ():
                if not measures(m, subject):
                    continue
                s.merge_checks += 1
                ratio = _ratio(m.get("worst_ratio"))
                if s.worst_ratio is None or ratio > s.worst_ratio:
                    s.worst_ratio = ratio
                    s.worst_case = {"nodeid": r["nodeid"], "dtype": m.get("dtype"),
                                    "kind": m.get("kind"), "world_size": m.get("world_size"),
                                    "base": m.get("base"),
                                    "max_ulp_err": (m.get("output") or {}).get("max_ulp_err")}
        s.headroom = headroom(s.worst_ratio)
        if p.run:
            s.reason = None
            if s.failed or s.unfinished:  # a tier the session died in never reads as a pass
                s.status = "failed"
                if s.unfinished:
                    s.reason = f"the pytest session ended before {s.unfinished} of its tests"
            elif s.cases == 0:
                s.status = "no tests"
                s.reason = ("no test in this tier" + (" after --quick" if s.left_out else ""))
            elif s.passed + s.xpassed == 0:
                s.status = "skipped"
                s.reason = max(s.skip_reasons, key=s.skip_reasons.get) if s.skip_reasons else None
            else:
                s.status = "passed"
        out.append(s)
    return out


def summarise_dtypes(records: list[dict], subject: str | None = None) -> dict:
    """Per output dtype: merge checks, elements, summed ulp histograms per kind (a2a, ag_rs),
    the summed histogram of err / bound (the pass criterion), the largest error in ulps and the
    worst error / bound over all tests that ran (of ``subject``'s code only, when given), and
    which checks the upstream vLLM #41160 comparison would fail."""
    from .compare import RATIO_BIN_EDGES, ULP_BIN_EDGES

    nbins = len(ULP_BIN_EDGES) - 1
    out: dict[str, dict] = {}
    for r in records:
        for m in r.get("merge_reports") or ():
            if not measures(m, subject):
                continue
            dt = m.get("dtype", "?")
            d = out.setdefault(dt, {"checks": 0, "elements": 0, "histogram": {},
                                    "ratio_histogram": [0] * (len(RATIO_BIN_EDGES) - 1),
                                    "max_ulp_err": 0.0, "worst_ratio": 0.0, "worst_case": None,
                                    "upstream_would_pass": 0, "upstream_failing": [],
                                    "failing_checks": 0})
            d["checks"] += 1
            o = m.get("output") or {}
            d["elements"] += int(o.get("elements") or 0)
            h = m.get("ulp_histogram") or [0] * nbins
            acc = d["histogram"].setdefault(m.get("kind", "a2a"), [0] * nbins)
            for i, c in enumerate(h[:nbins]):
                acc[i] += int(c)
            for i, c in enumerate((m.get("ratio_histogram") or [])[:len(d["ratio_histogram"])]):
                d["ratio_histogram"][i] += int(c)
            ulp_err = o.get("max_ulp_err")
            ulp_err = float(ulp_err) if isinstance(ulp_err, (int, float, str)) else math.nan
            if not math.isnan(ulp_err):
                d["max_ulp_err"] = max(d["max_ulp_err"], ulp_err)
                by = d.setdefault("max_ulp_err_by_kind", {})
                kind = m.get("kind", "a2a")
                by[kind] = max(by.get(kind, 0.0), ulp_err)
            d["worst_output_ratio"] = max(d.get("worst_output_ratio", 0.0),
                                          _ratio(o.get("worst_ratio")))
            ratio = _ratio(m.get("worst_ratio"))
            if d["worst_case"] is None or ratio > d["worst_ratio"]:
                d["worst_ratio"] = ratio
                d["worst_case"] = {"nodeid": r["nodeid"], "kind": m.get("kind"),
                                   "world_size": m.get("world_size"), "base": m.get("base")}
            if not m.get("ok", True):
                d["failing_checks"] += 1
            failing = [q["quantity"] for q in (o, m.get("lse") or {})
                       if q and not q.get("upstream_ok", True)]
            if failing:
                d["upstream_failing"].append({"nodeid": r["nodeid"], "quantities": failing,
                                              "kind": m.get("kind"),
                                              "world_size": m.get("world_size")})
            else:
                d["upstream_would_pass"] += 1
    for d in out.values():
        d["headroom"] = headroom(d["worst_ratio"])
        d["bin_edges"] = list(ULP_BIN_EDGES)
        d["ratio_bin_edges"] = list(RATIO_BIN_EDGES)
    return dict(sorted(out.items()))


def totals(records: list[dict]) -> dict:
    t = {k: 0 for k in OUTCOMES}
    dur = 0.0
    for r in records:
        t[r["outcome"]] = t.get(r["outcome"], 0) + 1
        dur += float(r.get("duration") or 0.0)
    t["cases"] = len(records)
    t["test_time_s"] = dur
    return t


SLOWEST = 30


def slowest(records: list[dict], k: int = SLOWEST) -> list[dict]:
    """The ``k`` tests that took longest (setup + call + teardown; on a GPU the first test to
    launch a kernel specialisation also pays its compile): where a tier's time goes."""
    top = sorted(records, key=lambda r: -float(r.get("duration") or 0.0))[:k]
    return [{"nodeid": r["nodeid"], "duration_s": round(float(r.get("duration") or 0.0), 3),
             "outcome": r["outcome"], "tiers": list(r.get("tiers") or ())} for r in top]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def as_plain(obj):
    """dataclasses -> dicts; non-finite floats -> "inf"/"-inf"/"nan" (valid JSON)."""
    if hasattr(obj, "__dataclass_fields__"):
        obj = asdict(obj)
    if isinstance(obj, dict):
        return {str(k): as_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj
