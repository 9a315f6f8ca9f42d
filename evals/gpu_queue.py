"""Run a list of jobs on one GPU, as many at once as its memory holds.

    python -m dcp_a2a.evals.gpu_queue JOBS --logs DIR [--budget-gb G]

``JOBS`` is a text file, one job a line: ``NAME GB COMMAND...`` -- a name (letters, digits,
``._-``), the GPU memory the job is expected to peak at, in GiB, and a shell command. Blank
lines and lines starting with ``#`` are skipped. Jobs start in file order; a job waits while
the jobs running and it together would exceed the budget (the card's memory less 3 GiB, from
``nvidia-smi``, or ``--budget-gb``); no later job starts ahead of it (first come, first
served: the file's order is the order of importance). A job that fails with CUDA out of memory
is run once more, alone. Each job's output goes to
``DIR/NAME.log`` and its exit status to ``DIR/NAME.rc`` (``DIR/NAME.oom`` marks the first try's
out-of-memory); ``DIR/queue.log`` says when each started and ended. The queue's exit status is
0 when every job's was.

Why: the GSM8K runs of docs/evals.md are one process per backend and dtype (each loads the
model on the CPU for a minute, then is mostly host-bound on the GPU), so several share the card;
the memory a run peaks at is only estimated beforehand, hence the retry alone.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

OOM = re.compile(r"OutOfMemoryError|CUDA out of memory")
NAME = re.compile(r"[A-Za-z0-9._-]+")
RESERVE_GB = 3.0  # CUDA contexts and the allocator's slack


@dataclass
class Job:
    name: str
    gb: float
    command: str
    alone: bool = False
    proc: subprocess.Popen | None = None
    t0: float = 0.0


def parse(text: str) -> list[Job]:
    """The jobs of a JOBS file; ValueError naming the line for a malformed one."""
    jobs, seen = [], set()
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or not NAME.fullmatch(parts[0]):
            raise ValueError(f"line {no}: expected 'NAME GB COMMAND...', got {line!r}")
        try:
            gb = float(parts[1])
        except ValueError:
            raise ValueError(f"line {no}: GB must be a number, got {parts[1]!r}") from None
        if gb < 0 or parts[0] in seen:
            raise ValueError(f"line {no}: negative GB or a repeated name {parts[0]!r}")
        seen.add(parts[0])
        jobs.append(Job(parts[0], gb, parts[2]))
    return jobs


def card_gb() -> float:
    """The first GPU's memory in GiB, from nvidia-smi (which counts MiB)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,"
                          "nounits", "-i", "0"], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0]) / 1024


def run(jobs: list[Job], logs: Path, budget_gb: float, poll_s: float = 2.0) -> int:
    """Run ``jobs`` under ``budget_gb``; returns 0 when every job exited 0."""
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "queue.log", "a", buffering=1) as qlog:
        return _run(jobs, logs, budget_gb, poll_s, lambda msg: print(
            f"{time.strftime('%H:%M:%S')} {msg}", file=qlog))


def _run(jobs, logs, budget_gb, poll_s, say) -> int:
    share = lambda j: budget_gb if j.alone else min(j.gb, budget_gb)  # noqa: E731
    waiting, running, failed = list(jobs), [], []
    say(f"budget {budget_gb:.1f} GiB, {len(jobs)} jobs")
    while waiting or running:
        for job in list(running):
            rc = job.proc.poll()
            if rc is None:
                continue
            running.remove(job)
            log = (logs / f"{job.name}.log").read_text(errors="replace")
            if rc != 0 and not job.alone and OOM.search(log):
                (logs / f"{job.name}.oom").write_text(log[-4000:])
                say(f"{job.name}: out of memory after {time.time() - job.t0:.0f} s, again alone")
                job.alone = True
                waiting.insert(0, job)
                continue
            (logs / f"{job.name}.rc").write_text(f"{rc}\n")
            say(f"{job.name}: exit {rc} after {time.time() - job.t0:.0f} s")
            if rc != 0:
                failed.append(job.name)
        used = sum(share(j) for j in running)
        while waiting and not (running and used + share(waiting[0]) > budget_gb):
            job = waiting.pop(0)
            with open(logs / f"{job.name}.log", "w") as fh:
                job.proc = subprocess.Popen(["bash", "-c", job.command], stdout=fh,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            job.t0 = time.time()
            running.append(job)
            used += share(job)
            say(f"{job.name}: started ({share(job):.0f} of {budget_gb:.0f} GiB): {job.command}")
        time.sleep(poll_s)
    say(f"done; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dcp_a2a.evals.gpu_queue",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("jobs", type=Path, help="the JOBS file: NAME GB COMMAND... per line")
    ap.add_argument("--logs", type=Path, required=True, help="directory for logs and statuses")
    ap.add_argument("--budget-gb", type=float, default=None,
                    help=f"GPU memory for the jobs, GiB (default: the card's less {RESERVE_GB:g})")
    args = ap.parse_args(argv)
    try:
        jobs = parse(args.jobs.read_text())
    except (OSError, ValueError) as e:
        print(f"gpu_queue: {e}", file=sys.stderr)
        return 2
    budget = args.budget_gb if args.budget_gb is not None else card_gb() - RESERVE_GB
    print(f"gpu_queue: {len(jobs)} jobs, budget {budget:.1f} GiB: "
          + " ".join(shlex.quote(j.name) for j in jobs))
    return run(jobs, args.logs, budget)


if __name__ == "__main__":
    sys.exit(main())
