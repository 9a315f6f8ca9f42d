"""``dcp-a2a self-check``: does the conformance tier catch every shipped bug, and pass every
correct implementation?

    dcp-a2a self-check [--jobs 2] [--only NAME ...] [--json report.json]

Runs ``pytest -m conformance --impl SPEC -n JOBS`` once per implementation
(:mod:`.conformance_run`):

* each correct implementation (``dcp_a2a``; ``dcp_a2a.reference.contract``;
  ``dcp_a2a.testing.freedoms``, which takes every freedom the contract leaves; and
  ``dcp_a2a.testing.independent``, written from scratch without the reference's code: the
  guards against tests that fail correct code): every conformance test must pass;
* each mutant in ``dcp_a2a/testing/mutants/`` (one realistic bug per module, its docstring's
  first line names the class of failure): at least one conformance test must fail. Mutant runs
  stop at the first failure (``-x``) and run in one process each (``--mutant-jobs 1``:
  starting xdist workers costs more than the tests a mutant reaches), ``--parallel`` of them at
  a time.

Every implementation named on the command line (``--correct``, ``--mutants``) is loaded before
any run: one that cannot be is a usage error (exit 2) at once. Prints a kill table (mutant,
killed?, first failing test, time) and the wall time of each correct implementation's full run,
and exits non-zero if a mutant survives, a correct implementation fails, or a run could not be
judged (collection errors, timeout): 1; 5 when nothing was checked (no run selected, or every
one needs GPUs this machine lacks). (``python -m dcp_a2a.testing.selfcheck`` is the same
program.)
"""

from __future__ import annotations

import argparse
import ast
import json
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

from . import args as a
from . import conformance_run as cr
from .conformance_run import CONFORMANCE_DIR, MUTANTS_DIR, Run, describe_spec
from .cores import thread_share

SUMMARY = "every shipped mutant caught and every correct implementation passing the suite"
DESCRIPTION = __doc__.split("\n\n")[0].replace("``", "")

CORRECT = ("dcp_a2a", "dcp_a2a.reference.contract", "dcp_a2a.testing.freedoms",
           "dcp_a2a.testing.independent")
# the correct implementations besides the project's own (which validate judges already)
FOREIGN_CORRECT = CORRECT[1:]
# ... those gpu-check runs on CUDA, where a full conformance run costs about a minute (gpu-check
# within 240 s): the two that differ on the GPU (the pure-PyTorch contract, allocating under
# capture, and the one taking every freedom); independent's differences show on the CPU
GPU_CHECK_CORRECT = ("dcp_a2a.reference.contract", "dcp_a2a.testing.freedoms")
MUTANTS_PACKAGE = "dcp_a2a.testing.mutants"


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



def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--jobs", "-n", type=a.processes, default=2,
                    help="pytest-xdist workers for a correct implementation's run (default 2; "
                         "1 runs without xdist)")
    ap.add_argument("--mutant-jobs", type=a.processes, default=1,
                    help="pytest-xdist workers per mutant run (default 1: no xdist)")
    ap.add_argument("--parallel", type=a.processes, default=2,
                    help="mutant runs at a time (default 2)")
    ap.add_argument("--correct-parallel", type=a.processes, default=1, metavar="K",
                    help="correct implementations' runs at a time, each with --jobs workers "
                         "(default 1: one after the other)")
    ap.add_argument("--only", nargs="+", metavar="NAME", action=a.Distinct,
                    type=a.text("a mutant's module name or a correct implementation's spec"),
                    help="run only these mutants (module names) and correct implementations")
    ap.add_argument("--correct", nargs="*", default=list(CORRECT), metavar="SPEC",
                    action=a.Distinct, type=a.text("an implementation spec"),
                    help=f"correct implementations to run (default: {' '.join(CORRECT)}; none "
                         "when given without a SPEC)")
    ap.add_argument("--no-mutants", action="store_true", help="run the correct ones only")
    ap.add_argument("--mutants", nargs="+", metavar="SPEC", dest="mutant_specs",
                    action=a.Distinct, type=a.text("an implementation spec"),
                    help="judge these implementation specs as mutants instead of the corpus "
                         "(e.g. to check that a suspected bug is caught)")
    ap.add_argument("--paths", nargs="+", default=[str(CONFORMANCE_DIR)], action=a.Distinct,
                    type=a.existing_path,
                    help="test paths handed to pytest (default: the shipped conformance suite)")
    ap.add_argument("--marker", default="conformance", type=a.pytest_marker,
                    help="pytest -m expression (default conformance)")
    ap.add_argument("--timeout", type=a.seconds(), default=600.0,
                    help="seconds per implementation run before it is killed (default 600)")
    ap.add_argument("--json", type=a.out_file, help="also write the results as JSON here")
    ap.add_argument("--workdir", type=a.out_dir, help="keep logs and result records here")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")


def check(parser, args) -> None:
    if args.no_mutants and args.mutant_specs:
        parser.error("argument --no-mutants: not with --mutants")


def main(args=None) -> int:
    """``dcp-a2a self-check``; ``args``: its parsed arguments, or an argument list."""
    from . import cli

    args = cli.arguments("self-check", args)
    root = cr.repo_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    named = []  # implementations named on the command line: loaded before any run
    if args.mutant_specs or args.correct:
        from .impl import importable

        try:  # a file or a module next to the user: module form, importable by every session
            args.mutant_specs = [importable(s) for s in args.mutant_specs or ()] or None
            args.correct = [importable(s) for s in args.correct]
        except ValueError as e:
            return usage(str(e))
        named = list(args.correct) + list(args.mutant_specs or ())
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
            return usage(f"argument --only: unknown mutant(s) {', '.join(sorted(unknown))}")
        mutants = [(s, d) for s, d in mutants if s.rsplit(".", 1)[-1] in wanted]
        correct = [c for c in args.correct if c in wanted]
        named = [s for s in named if s in correct or s in {m for m, _ in mutants}]
    else:
        correct = list(args.correct)
    if args.no_mutants:
        mutants = []

    env = cr.child_env(root)
    broken = cr.preflight(sorted(set(correct) | {m for m, _ in mutants}), root, env)
    refused = [f"{spec}: {broken[spec]}" for spec in named if spec in broken]
    if refused:  # the user's own specs: refused now, not after minutes of other runs
        return usage("cannot load " + "; ".join(refused))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="dcp_a2a_selfcheck_")).expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    common = dict(root=root, timeout=args.timeout, workdir=workdir,
                  paths=[str(p) for p in args.paths], marker=args.marker)
    total_runs = len(correct) + len(mutants)
    runs: list[Run] = []

    def report(run: Run) -> None:
        runs.append(run)
        print(f"[{len(runs)}/{total_runs}] {run.spec}: {run.verdict} in {run.seconds:.1f} s"
              + (f" ({run.first_failure})" if run.first_failure else ""), flush=True)

    t0 = time.time()
    # correct implementations before the mutants, --correct-parallel at a time. (Run beside
    # the mutants instead, on one H100 with 16 cores, neither had finished after 245 s, against
    # ~70 s each alone: then every xdist worker still started a pool of 8 ranks of its own,
    # see .poolgroup.)
    at_once = ThreadPoolExecutor(max_workers=args.correct_parallel)
    try:
        futures = [at_once.submit(cr.run_one, spec, "correct", jobs=args.jobs,
                                  broken=broken.get(spec, ""), **common) for spec in correct]
        for fut in as_completed(futures):
            report(fut.result())
    finally:
        for proc in list(cr.LIVE):
            cr.kill_group(proc)
        at_once.shutdown(wait=True, cancel_futures=True)
    pool = ThreadPoolExecutor(max_workers=args.parallel)
    threads = thread_share(args.parallel * args.mutant_jobs)
    try:
        futures = [pool.submit(cr.run_one, spec, "mutant", jobs=args.mutant_jobs,
                               description=desc, broken=broken.get(spec, ""), threads=threads,
                               **common)
                   for spec, desc in mutants]
        for fut in as_completed(futures):
            report(fut.result())
    finally:  # on an interrupt: end the running pytest sessions, then the threads waiting on them
        for proc in list(cr.LIVE):
            cr.kill_group(proc)
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
        from .outpaths import make_parent

        make_parent(args.json).write_text(json.dumps(
            {"runs": [asdict(r) for r in runs], "seconds": total,
             "ok": not bad and bool(checked)}, indent=1))
    return 1 if bad else (0 if checked else 5)


def usage(message: str) -> int:
    print(f"dcp-a2a self-check: error: {message}", file=sys.stderr)
    return a.EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
