"""The model-level jobs of ``dcp-a2a validate --evals``: logit parity and a GSM8K subset, each
run as its own command (``python -m dcp_a2a.evals.logit_parity``, ``... .gsm8k``), planned with
every reason it cannot run here named before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .impl import DEFAULT_SPEC
from .machine import GSM8K_ENV, REPO_ROOT
from .sessions import terminate


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
    """Logit parity and the GSM8K subset, each with every reason it cannot run here (each
    missing thing named exactly, ``; ``-separated), known before anything runs. Each job writes
    into ``DIR/evals/<job>/`` (its ``--out``); its ``results.json`` (or first JSON file) becomes
    ``result`` in the report.

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
        if impl not in (None, DEFAULT_SPEC):
            job.reason = (f"the evals run dcp_a2a's own combine inside a model; they cannot "
                          f"measure --impl {impl}")
            continue
        if not mods.get(job.module):
            job.reason = f"{job.module} is not in this installation"
            continue
        missing = []
        absent = [m.replace("_", "-") for m in needs if not mods.get(m)]
        if absent:
            missing.append(_not_installed(absent))
        if model is None:
            missing.append(f"eval model {name} is not prepared (python -m dcp_a2a.evals.prepare "
                           f"--model {name})" if name else
                           "no eval model is prepared (python -m dcp_a2a.evals.prepare "
                           "--model NAME; docs/evals.md lists them)")
        if not machine["gsm8k_present"]:
            missing.append(f"GSM8K data not found at {machine['gsm8k_dir']} (test.jsonl; "
                           f"--gsm8k-dir or ${GSM8K_ENV})")
        job.reason = "; ".join(missing) or None
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
            terminate(proc)
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

