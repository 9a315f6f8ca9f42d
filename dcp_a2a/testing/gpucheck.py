"""``dcp-a2a gpu-check``: what a kernel author runs on a GPU machine before merging.

Four steps, one exit status, one summary:

1. ``dcp-a2a validate`` -- every tier this machine supports (the gpu tier, and the multigpu
   tier with 2+ GPUs; the multi-process tier on gloo ranks that share the GPUs);
2. the self-check (``dcp-a2a self-check --correct dcp_a2a.reference.contract
   dcp_a2a.testing.freedoms``):
   every mutant killed by the conformance tier with the kernels compiled -- a verdict the
   interpreter cannot give (an unchecked in-place pack came out right on a GPU at the sizes
   that caught it on the CPU) -- and the pure-PyTorch correct implementations passing it on
   CUDA, graphs included; the project's own implementation passed the same tier in step 1;
3. the accuracy job on every visible GPU, over NCCL (``torchrun --nproc-per-node <GPUs> -m
   dcp_a2a accuracy --dist-backend nccl``; on one GPU: 2 gloo ranks sharing it);
4. a quick benchmark of the kernels (``dcp-a2a bench --quick``).

Steps 2 and 3 run at the same time (:data:`SCHEDULE`), the others alone.

Everything lands in ``DIR`` (default ./gpu-check): validation.{json,md}, selfcheck.json,
accuracy.json, bench.json, the logs, and gpu-check.md with the summary printed at the end.
``--skip STEP`` leaves steps out (the summary then says which; it never reads as a full pass).
Exit status: 0 every step run passed, 1 a step failed, 2 TRITON_INTERPRET is set (the
interpreter is not what gpu-check judges), 3 no CUDA GPU here, 5 every step skipped (nothing
checked).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import args as a

SUMMARY = ("before merging, on a GPU machine: validate, the self-check, the NCCL accuracy job "
           "on every GPU and a quick benchmark; one exit status, one summary")
DESCRIPTION = (
    "Run `dcp-a2a validate` (every tier this machine supports), the self-check (every mutant "
    "killed with the kernels compiled; the reference contract passing), the accuracy job on "
    "every visible GPU over NCCL, and a quick kernel benchmark; write DIR/gpu-check.md and "
    "print one summary. Exit status: 0 all passed, 1 a step failed, 2 usage error (or "
    "TRITON_INTERPRET set), 3 no CUDA GPU here, 5 every step skipped (nothing checked).")


@dataclass
class Step:
    name: str
    status: str = "not run"     # passed / failed / not run
    wall_s: float = 0.0
    detail: str = ""
    log: str = ""


# A step's last resort against a hang (validate and the self-check also stop what hangs inside
# them; the accuracy job's NCCL ranks and the bench have no watchdog of their own): far above
# each step's time on one H200, so only a hang reaches it.
STEP_TIMEOUT_S = {"validate": 3600, "selfcheck": 3600, "accuracy": 900, "bench": 600}
TIMED_OUT = 124
_LIVE: set = set()  # the steps' processes running now (stopped with everything they started)


def _run(cmd: list[str], log: Path, env: dict, timeout_s: float | None = None
         ) -> tuple[int, float]:
    """Run a step in a process group of its own; one that outlives ``timeout_s`` is killed
    with everything it started and exits :data:`TIMED_OUT`."""
    import signal

    t0 = time.monotonic()
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        _LIVE.add(proc)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc, signal.SIGTERM)
            fh.write(f"\ngpu-check: killed after {timeout_s:.0f} s (a hang)\n")
            code = TIMED_OUT
        except KeyboardInterrupt:  # its own session sees no Ctrl-C: pass it on, then stop
            _stop(proc, signal.SIGINT)
            raise
        finally:
            _LIVE.discard(proc)
    return code, time.monotonic() - t0


def _stop(proc, first) -> None:
    """End a step's session: ``first``, then SIGTERM, then SIGKILL, 10 s apart."""
    import signal

    for sig in (first, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(10)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _stop_live() -> None:
    """Ctrl-C while steps run in threads (the main thread gets it): end their sessions."""
    import signal

    for proc in list(_LIVE):
        _stop(proc, signal.SIGINT)


def _run_step(step: Step, key: str, cmd: list[str], log: Path, env: dict, report: Path
              ) -> int | None:
    """Run ``cmd`` as ``step`` under ``STEP_TIMEOUT_S[key]``, a previous run's ``report``
    removed first (a step that writes none never reads an old one). The exit status, or None
    when it hung and was killed (the step's detail then says so)."""
    report.unlink(missing_ok=True)
    code, step.wall_s = _run(cmd, log, env, STEP_TIMEOUT_S[key])
    step.status = "passed" if code == 0 else "failed"
    if code == TIMED_OUT:
        step.detail = f"killed after {STEP_TIMEOUT_S[key]:.0f} s (a hang); log {log}"
        return None
    return code


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _env() -> dict:
    from .childenv import child_env
    from .machine import PACKAGE_PARENT

    return child_env(PACKAGE_PARENT, PYTHONUNBUFFERED="1")


def validate_step(out: Path, workers, env: dict) -> Step:
    """``python -m dcp_a2a validate`` in a process of its own (this module imports nothing of
    the command line: the dependency runs one way, cli -> gpucheck)."""
    step = Step("validate (all tiers)")
    log = out / "validate.log"
    cmd = [sys.executable, "-m", "dcp_a2a", "validate", "--out", str(out), "--no-progress"]
    if workers is not None:
        cmd += ["-j", str(workers)]
    code = _run_step(step, "validate", cmd, log, env, out / "validation.json")
    step.log = str(out / "validation.md")
    if code is None:
        return step
    try:
        rep = json.loads((out / "validation.json").read_text())
        ran = [t for t in rep["tiers"] if t["status"] != "not run"]
        step.detail = ", ".join(f"{t['name']} {t['passed']}/{t['cases']}" for t in ran)
        not_run = [t["name"] for t in rep["tiers"] if t["status"] == "not run"]
        if not_run:
            step.detail += f"; not run: {', '.join(not_run)}"
    except (OSError, ValueError, KeyError):
        step.detail = f"exit status {code}: {_tail(log)}"
    return step


def selfcheck_step(out: Path, workers, env: dict) -> Step:
    from .cores import available_cores
    from .selfcheck import GPU_CHECK_CORRECT
    from .sessions import GPU_WORKERS

    step = Step("self-check")
    report = out / "selfcheck.json"
    log = out / "selfcheck.log"
    # -j as the validate step takes it (0: one process; unset or auto: validate's GPU default),
    # shared by the correct implementations' runs, which run at once: on one H200 (2026-12-05)
    # each took 45 s with 8 workers, one after the other, the machine 40-85% busy
    cores = available_cores()
    jobs = max(1, workers if isinstance(workers, int) else min(GPU_WORKERS, cores))
    together = len(GPU_CHECK_CORRECT) if jobs >= len(GPU_CHECK_CORRECT) else 1
    # mutant runs stop at their first failure: mostly start-up (a CUDA context each), 3-13 s on
    # that H200, 6 at a time kept its 16 cores 40-45% busy; so three quarters of the cores
    parallel = max(1, min(12, cores * 3 // 4))
    cmd = [sys.executable, "-m", "dcp_a2a", "self-check", "--correct",
           *GPU_CHECK_CORRECT, "--jobs", str(max(1, jobs // together)),
           "--correct-parallel", str(together),
           "--parallel", str(parallel), "--json", str(report),
           "--workdir", str(out / "selfcheck")]
    code = _run_step(step, "selfcheck", cmd, log, env, report)
    step.log = str(log)
    if code is None:
        return step
    try:
        runs = json.loads(report.read_text())["runs"]
        mutants = [r for r in runs if r["kind"] == "mutant"]
        killed = sum(r["verdict"] == "killed" for r in mutants)
        not_run = sum(r["verdict"] == "not run" for r in mutants)
        parts = [f"{killed}/{len(mutants)} mutants killed"
                 + (f" ({not_run} need more GPUs: not run)" if not_run else "")]
        parts += [f"{r['spec']} {r['verdict']} ({r['passed']} passed, {r['failed']} failed)"
                  for r in runs if r["kind"] == "correct"]
        parts += [f"{r['spec'].rsplit('.', 1)[-1]} {r['verdict']}" for r in mutants
                  if r["verdict"] not in ("killed", "not run")]
        step.detail = "; ".join(parts)
    except (OSError, ValueError, KeyError):
        step.detail = f"exit status {code}: {_tail(log)}"
    return step


def accuracy_step(out: Path, gpus: int, env: dict) -> Step:
    nproc, backend = (gpus, "nccl") if gpus >= 2 else (2, "gloo")
    step = Step(f"accuracy N={nproc} {backend}")
    report = out / "accuracy.json"
    log = out / "accuracy.log"
    # every case and check of the job, timed over 2 calls after 1 warm-up instead of 20 after 3:
    # gpu-check judges the results, not the times, and on one H100 (a86bf2b) the 23 calls of
    # each case were ~45 s of the step's 66 s (its 8192x64x512 cases ~0.3 s a call over gloo)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "dcp_a2a", "accuracy",
           "--dist-backend", backend, "--warmup", "1", "--iters", "2",
           "--out", str(report), "--quiet"]
    code = _run_step(step, "accuracy", cmd, log, env, report)
    step.log = str(log)
    if code is None:
        return step
    try:
        rep = json.loads(report.read_text())
        failed = sum(not c["ok"] for c in rep["cases"])
        bitwise = all(c.get("bitwise_eq_packed", True) for c in rep["cases"])
        compared = sorted({c["backend"] for c in rep["cases"] if "bitwise_eq_packed" in c})
        step.detail = (f"{len(rep['cases'])} cases, {failed} failed; "
                       f"{', '.join(compared) or 'nothing'} == packed bitwise: "
                       f"{'yes' if bitwise else 'NO'}")
    except (OSError, ValueError, KeyError):
        step.detail = f"exit status {code}: {_tail(log)}"
    return step


def bench_step(out: Path, env: dict) -> Step:
    step = Step("bench (quick)")
    report = out / "bench.json"
    log = out / "bench.log"
    code = _run_step(step, "bench", [sys.executable, "-m", "dcp_a2a", "bench", "--quick",
                                     "--out", str(report)], log, env, report)
    step.log = str(log)
    if code is None:
        return step
    try:
        rep = json.loads(report.read_text())
        rows = [r for r in rep["rows"] if r["variant"] == "default"
                and r["op"] in ("pack", "unpack_combine")]
        step.detail = "; ".join(f"{r['op']} {r['shape']}: {r['us']:.1f} us "
                                f"({r['pct_copy']:.0f}% of copy)" for r in rows)
    except (OSError, ValueError, KeyError):
        step.detail = f"exit status {code}: {_tail(log)}"
    return step


STEPS = ("validate", "selfcheck", "accuracy", "bench")
# The steps in the order they run; steps in one tuple run at the same time. The self-check and
# the accuracy job share the machine: the self-check's two correct runs left an H100's 16 cores
# 12-26% busy (2026-12-05), the accuracy job judges results (its times over 2 calls are not a
# benchmark). The bench runs alone: it times kernels.
SCHEDULE = (("validate",), ("selfcheck", "accuracy"), ("bench",))


def exit_status(steps: list[Step]) -> int:
    """0 every step run passed, 1 one failed, 5 none ran (every step skipped: nothing was
    checked, as validate's exit status 5 says)."""
    if all(s.status == "skipped" for s in steps):
        return 5
    return 0 if all(s.status in ("passed", "skipped") for s in steps) else 1


# GPU memory that other processes hold before the steps start (or after they end) above which
# the summary says the card was shared: a CUDA context is ~0.5 GiB, a GSM8K job ~46 GiB.
SHARED_GIB = 2.0


def gpu_memory_in_use(query=None) -> list[tuple[int, float, float]]:
    """[(GPU index, GiB in use, GiB in all)] from nvidia-smi ([] where it cannot tell).
    ``query``: a stand-in for the nvidia-smi call (tests), returning its CSV text."""
    try:
        text = query() if query else subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.used,memory.total",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
            check=True).stdout
        rows = [[float(x) for x in line.split(",")] for line in text.splitlines() if line.strip()]
        found = [(int(i), used / 1024, total / 1024) for i, used, total in rows]
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    visible = {v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")}
    if all(v.isdigit() for v in visible):  # indices (unset, empty or UUIDs: every GPU)
        found = [g for g in found if str(g[0]) in visible]
    return found


def shared_note(*samples: list[tuple[int, float, float]]) -> str:
    """A line for the summary when another process held more than :data:`SHARED_GIB` of a
    GPU in any of ``samples`` (taken while gpu-check held none): its out-of-memory failures
    may be the neighbour's. Empty otherwise."""
    worst: dict[int, tuple[float, float]] = {}
    for sample in samples:
        for i, used, total in sample:
            if used > SHARED_GIB and used > worst.get(i, (0.0, 0.0))[0]:
                worst[i] = (used, total)
    if not worst:
        return ""
    held = ", ".join(f"GPU {i}: {u:.1f} of {t:.1f} GiB" for i, (u, t) in sorted(worst.items()))
    return (f"note: the card was shared ({held} held by other processes before or after the "
            "steps): an out-of-memory failure may be theirs; run gpu-check alone on the card "
            "for a verdict")


def code_roots() -> list[Path]:
    """What the steps import and collect: the package (with the reference and the evals,
    which the checkout maps into it), and in a checkout its tests and tolerances.yaml."""
    from importlib.util import find_spec

    from .machine import REPO_ROOT

    specs = (find_spec(name) for name in ("dcp_a2a", "dcp_a2a.reference", "dcp_a2a.evals"))
    roots = [Path(spec.origin).parent for spec in specs if spec is not None]
    if (REPO_ROOT / "tests" / "conftest.py").is_file():
        roots += [REPO_ROOT / "tests", REPO_ROOT / "tolerances.yaml"]
    return roots


def code_fingerprint(roots: list[Path]) -> dict[str, tuple[int, int]]:
    """{path: (size, mtime in ns)} of every .py and .yaml file under ``roots`` (directories or
    files; caches left out)."""
    seen = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []
        for f in files:
            if f.suffix in (".py", ".yaml") and "__pycache__" not in f.parts and f.is_file():
                st = f.stat()
                seen[str(f)] = (st.st_size, st.st_mtime_ns)
    return seen


def changed_note(before: dict, after: dict) -> str:
    """A line for the summary when files of the code under test changed while the steps ran
    (an editor, a checkout, a copy into the tree): their verdict is of no one version."""
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if not changed:
        return ""
    return (f"note: {len(changed)} file(s) of the code under test changed during the run (first: "
            f"{changed[0]}): the steps may have judged a mix of versions; run gpu-check again on "
            "a tree that nothing writes to")


def summary(steps: list[Step], machine: str, wall_s: float | None = None,
            note: str = "") -> str:
    """The summary of ``steps`` (in :data:`STEPS` order); ``wall_s``: the check's wall time;
    ``note``: lines printed above the verdict (:func:`shared_note`, :func:`changed_note`)."""
    w = max(len(s.name) for s in steps)
    lines = [f"dcp-a2a gpu-check on {machine}", ""]
    for s in steps:
        lines.append(f"{s.name:<{w}}  {s.status.upper() if s.status != 'passed' else 'passed':<7}"
                     f" {s.wall_s:7.1f} s  {s.detail}")
    if wall_s is not None:  # steps of one stage overlap: not the steps' sum
        ran = {key for key, s in zip(STEPS, steps) if s.status != "skipped"}
        together = [" and ".join(names) for names in
                    (tuple(n for n in stage if n in ran) for stage in SCHEDULE) if len(names) > 1]
        lines.append(f"{'in all':<{w}}  {'':<7} {wall_s:7.1f} s"
                     + (f"  ({'; '.join(together)} at the same time)" if together else ""))
    skipped = [s.name for s in steps if s.status == "skipped"]
    verdict = {0: "PASS", 1: "FAIL", 5: "NOTHING CHECKED"}[exit_status(steps)]
    if skipped and len(skipped) < len(steps):
        verdict += f" (of the steps run; skipped: {', '.join(skipped)})"
    lines += ["", note] if note else []
    lines += ["", "gpu-check: " + verdict]
    return "\n".join(lines)


def run_schedule(run: dict, skip: set) -> dict:
    """{step name: Step}, the steps of :data:`SCHEDULE` run stage by stage (``run[name]()``),
    those of one stage at the same time; a skipped one is not run."""
    from concurrent.futures import ThreadPoolExecutor

    done = {}
    for stage in SCHEDULE:
        todo = [name for name in stage if name not in skip]
        done.update({name: Step(name, status="skipped", detail="--skip")
                     for name in stage if name in skip})
        if len(todo) == 1:
            done[todo[0]] = run[todo[0]]()
        elif todo:
            pool = ThreadPoolExecutor(max_workers=len(todo))
            try:
                futures = {name: pool.submit(run[name]) for name in todo}
                done.update({name: fut.result() for name, fut in futures.items()})
            except KeyboardInterrupt:
                _stop_live()
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    return done


def add_arguments(g: argparse.ArgumentParser) -> None:
    g.add_argument("--out", type=a.out_dir, default="gpu-check", metavar="DIR",
                   help="report directory, created if missing (default ./gpu-check)")
    g.add_argument("-j", "--workers", type=a.workers, default=None, metavar="N",
                   help="pytest-xdist workers for the validate step and the self-check's "
                        "contract run (default 16 at most on a GPU machine)")
    g.add_argument("--skip", nargs="+", choices=STEPS, metavar="STEP", action=a.Distinct,
                   help=f"leave out steps ({', '.join(STEPS)}); the summary names them and "
                        "never reads as a full pass")


def main(args=None) -> int:
    """``dcp-a2a gpu-check``; ``args``: its parsed arguments, or an argument list."""
    import torch

    from . import cli

    args = cli.arguments("gpu-check", args)

    from .devices import gpu_count

    gpus = gpu_count()
    if gpus == 0:
        print("dcp-a2a gpu-check: no CUDA GPU visible; it checks compiled kernels and NCCL "
              "(on a CPU machine run `dcp-a2a validate`)", file=sys.stderr)
        return 3
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print(f"dcp-a2a gpu-check: TRITON_INTERPRET={os.environ['TRITON_INTERPRET']} would run "
              "Triton's interpreter; gpu-check judges the compiled kernels (unset "
              "TRITON_INTERPRET)", file=sys.stderr)
        return 2
    from .outpaths import make_dir

    out = make_dir(args.out)
    env = _env()
    skip = set(args.skip or ())
    run = {"validate": lambda: validate_step(out, args.workers, env),
           "selfcheck": lambda: selfcheck_step(out, args.workers, env),
           "accuracy": lambda: accuracy_step(out, gpus, env),
           "bench": lambda: bench_step(out, env)}
    t0 = time.monotonic()
    before = gpu_memory_in_use()  # this process holds no CUDA context yet
    roots = code_roots()
    code = code_fingerprint(roots)
    done = run_schedule(run, skip)
    steps = [done[name] for name in STEPS]
    note = "\n".join(n for n in (shared_note(before, gpu_memory_in_use()),
                                  changed_note(code, code_fingerprint(roots))) if n)
    machine = (f"{gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
               f"triton {__import__('triton').__version__}")
    text = summary(steps, machine, time.monotonic() - t0, note)
    (out / "gpu-check.md").write_text("```\n" + text + "\n```\n")
    print("\n" + text, flush=True)
    return exit_status(steps)
