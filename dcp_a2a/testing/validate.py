"""``dcp-a2a validate``: find out what this machine can run, run those tiers, give one verdict.

The path from the command to the verdict:

1. the arguments (:mod:`.args` rules) and the implementation under test (:mod:`.impl`): a bad
   one is a usage error, exit 2, before anything runs;
2. the machine (:mod:`.machine`) and the plan (:mod:`.tiers`, :mod:`.evaljobs`): a tier named in
   ``--tiers`` or an eval job of ``--evals`` that cannot run here is exit 3 at once, naming
   every reason;
3. the pytest sessions (:mod:`.sessions`, shown by :mod:`.progress`), then the eval jobs;
4. the tally (:mod:`.tally`) and the verdict (:func:`exit_status`), the report
   (DIR/validation.json, DIR/validation.md, DIR/ulp_<dtype>.png; :mod:`.report`) and the summary.

The suite: in a source checkout, the project's ``tests/`` and the conformance suite shipped in
the package (the ``testpaths`` of pyproject.toml); with only an installed package, the shipped
conformance suite (``pytest --pyargs dcp_a2a.testing.conformance``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import args as a

SUMMARY = "run every test tier this machine supports and write a report"
DESCRIPTION = (
    "Detect the machine (CPU, GPUs, eval model, GSM8K data), run each test tier that can run "
    "here, print a summary and write DIR/validation.json, DIR/validation.md and "
    "DIR/ulp_<dtype>.png. Exit status: 0 all ran tiers passed, 1 a failure, 2 usage error (an "
    "empty or unusable --impl too), 3 something asked for cannot run here (a tier named in "
    "--tiers, or the evals of --evals: said at once, before any tier runs), 5 nothing "
    "validated (no test passed, or a tier named in --tiers passed none), 130 interrupted.")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_RUN, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_NOTHING_VALIDATED = 5  # pytest's "no tests ran"
GSM8K_QUESTIONS = 1319  # the GSM8K test split
EVAL_OPTIONS = ("gsm8k_dir", "gsm8k_limit", "gsm8k_backends", "eval_model")
DEFAULT_GSM8K_BACKENDS = "reference,packed"


def eval_backends() -> tuple[str, ...]:
    """What the GSM8K driver accepts (its module imports lm-eval, too heavy to ask before the
    arguments are checked; tests/cli/test_verdicts.py keeps the two equal)."""
    from .. import BACKENDS

    return ("reference",) + BACKENDS


def _eval_backends(value: str) -> str:
    return ",".join(a.items(eval_backends(), "backend")(value))


def _eval_model(value: str) -> str:
    from ..evals.model import MODELS

    if value not in MODELS:
        raise argparse.ArgumentTypeError(
            f"unknown model {value!r}; choose from {', '.join(MODELS)}")
    return value


def _suite(value: str) -> str:
    if not (Path(a.existing_dir(value)).expanduser() / "tests").is_dir():
        raise argparse.ArgumentTypeError(f"{value}: no tests/ directory there")
    return value


def add_arguments(v: argparse.ArgumentParser) -> None:
    from .tiers import TIERS

    v.add_argument("--impl", default=None, metavar="SPEC",
                   help="implementation under test, package.module[:attr] (default: "
                        "$DCP_A2A_IMPL or dcp_a2a; an empty value is refused); passed to pytest "
                        "as --impl. Under another implementation than dcp_a2a only the tests "
                        "that exercise it run")
    v.add_argument("--tiers", type=a.items(TIERS, "tier"), default=None, metavar="T1,T2",
                   help=f"tiers to run ({','.join(TIERS)}); default: every tier this machine "
                        "supports")
    v.add_argument("--quick", action="store_true",
                   help="fast pre-commit subset: unit, kernel and conformance tests that need "
                        "neither process groups (multiproc) nor numerics, no slow tests; one "
                        "case per test function of the project's own tests, every case of the "
                        "conformance tests (with --evals: the e2e tier too)")
    v.add_argument("--no-slow", action="store_true",
                   help="leave out tests marked slow (counted as not run in their tiers)")
    v.add_argument("--evals", action="store_true",
                   help="also run the e2e tier: its tests, logit parity and a GSM8K subset "
                        "(needs the eval model and data: when they are missing, exit 3 at once "
                        "naming them)")
    v.add_argument("--gsm8k-dir", type=a.existing_dir, default=None, metavar="DIR",
                   help="with --evals: GSM8K JSONL directory (default: $DCP_A2A_GSM8K_DIR or "
                        "../shared/data/gsm8k next to the repo)")
    v.add_argument("--gsm8k-limit", type=a.count(1, GSM8K_QUESTIONS), default=None, metavar="K",
                   help=f"with --evals: questions in the GSM8K subset, 1 to {GSM8K_QUESTIONS} "
                        "(default 50 on a GPU, 10 on CPU: ~10 s a question per backend there)")
    v.add_argument("--gsm8k-backends", type=_eval_backends, default=None, metavar="B1,B2",
                   help="with --evals: backends compared on GSM8K, the first is the baseline "
                        f"(default {DEFAULT_GSM8K_BACKENDS})")
    v.add_argument("--eval-model", type=_eval_model, default=None, metavar="NAME",
                   help="with --evals: model of the end-to-end evals (a registered one, "
                        "prepared with python -m dcp_a2a.evals.prepare --model NAME; default: "
                        "the strongest prepared one)")
    v.add_argument("--out", type=a.out_dir, default="validation-report", metavar="DIR",
                   help="report directory, created if missing (default ./validation-report)")
    v.add_argument("-j", "--workers", type=a.workers, default=None, metavar="N",
                   help="pytest-xdist workers ('auto' = one per CPU, 0 = no xdist; default auto "
                        "on CPU, 16 at most on a GPU machine, 0 with --quick: starting workers "
                        "costs more than the subset)")
    v.add_argument("--suite", type=_suite, default=None, metavar="DIR",
                   help="directory holding tests/ (default: the checkout this package is in; "
                        "with only the installed package, its shipped conformance suite)")
    v.add_argument("--stall-timeout", type=a.seconds(zero="never"), default=None, metavar="S",
                   help="stop a pytest session in which no test starts or ends for S seconds "
                        "(a hang: the tests running then fail, the rest count as not run), "
                        "counted from collection (start-up and collection get at least 120 s); "
                        "0 never (default 600)")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    v.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    v.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS",
                   help="extra arguments for pytest after --, e.g. -- -k pack -x")


def check(parser, args) -> None:
    """What no single flag's type can check: the eval options mean something only with the
    evals."""
    if args.tiers and "e2e" in args.tiers:
        args.evals = True  # the e2e tier is the evals' tier
    given = [f"--{o.replace('_', '-')}" for o in EVAL_OPTIONS if getattr(args, o) is not None]
    if given and not args.evals:
        parser.error(f"{', '.join(given)} only with --evals (or --tiers with e2e)")


def usage(message: str) -> int:
    print(f"dcp-a2a validate: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def exit_status(*, interrupted: bool, failed: bool, requested_not_run: list,
                nothing_validated: list) -> int:
    if interrupted:
        return EXIT_INTERRUPTED
    if failed:
        return EXIT_FAILED
    if requested_not_run:
        return EXIT_NOT_RUN
    if nothing_validated:
        return EXIT_NOTHING_VALIDATED
    return EXIT_OK


def main(args=None) -> int:
    """``dcp-a2a validate``; ``args``: its parsed arguments, or an argument list."""
    from . import cli

    args = cli.arguments("validate", args)
    from . import evaljobs
    from . import report as rep
    from . import sessions
    from . import tally
    from .cores import available_cores
    from .impl import load_impl, resolve_spec
    from .machine import detect_machine
    from .outpaths import make_dir
    from .progress import Progress
    from .tiers import plan_runs, plan_tiers

    t_start = time.monotonic()
    started = tally.now_iso()
    try:
        impl_obj = load_impl(resolve_spec(args.impl))
        impl = impl_obj.spec  # module form: the pytest sessions run elsewhere
    except ValueError as e:
        return usage(str(e))
    missing = impl_obj.missing()
    suite = sessions.find_suite(Path(args.suite).expanduser() if args.suite else None)

    machine = detect_machine(Path(args.gsm8k_dir).expanduser() if args.gsm8k_dir else None,
                             args.eval_model)
    requested = args.tiers
    plans = plan_tiers(machine, requested, args.evals, quick=args.quick)
    if args.workers is None:
        # a CUDA context per worker (and a pool of GPU ranks for the multi-process tests):
        # on a GPU machine a few workers, not one per core
        gpu_cap = min(sessions.GPU_WORKERS, available_cores())
        args.workers = 0 if args.quick else (gpu_cap if machine["cuda_device_count"] else "auto")
    runs = plan_runs(plans, args.workers if machine["modules"]["xdist"] else None)
    if args.no_slow:
        for spec in runs:
            spec.exclude = sorted(set(spec.exclude) | {"slow"})
    extra = list(args.pytest_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    out_dir = Path(args.out).expanduser().resolve()
    eval_jobs = []
    if args.evals:
        limit = args.gsm8k_limit or (50 if machine["cuda_device_count"] else 10)
        eval_jobs = evaljobs.plan_evals(machine, out_dir, limit,
                                        args.gsm8k_backends or DEFAULT_GSM8K_BACKENDS, impl)

    progress = Progress(not args.no_progress)
    progress.message(
        f"dcp-a2a validate: impl {impl_obj.describe()}, device {machine['device']} "
        f"(x{machine['cuda_device_count']}), triton {machine['triton_mode']}; report -> {out_dir}")
    if missing:
        progress.message(f"  note: {impl} lacks {', '.join(missing)}; tests needing them skip")
    for p in plans:
        progress.message(f"  {p.name:<12} {'run' if p.run else 'not run: ' + p.reason}")
    # what was asked for by name and cannot run here: said now, not after every other tier ran
    cannot = [(p.name, p.reason) for p in plans if requested and p.name in requested
              and not p.run]
    cannot += [(f"evals:{job.name}", job.reason) for job in eval_jobs if job.reason]
    if cannot:
        print(f"asked for but cannot run here: {', '.join(n for n, _ in cannot)} (exit status "
              f"3; nothing was run)")
        for name, why in cannot:
            print(f"  {name}: {why}")
        return EXIT_NOT_RUN
    out_dir = make_dir(out_dir)

    results = []
    evals = []
    interrupted = False
    try:
        for spec in runs:
            progress.start_run(spec)
            res = sessions.run_pytest(spec, out_dir, impl=impl, quick=args.quick, extra=extra,
                                      progress=progress, suite=suite,
                                      stall_s=(sessions.STALL_TIMEOUT_S if args.stall_timeout
                                               is None else args.stall_timeout))
            progress.end_run(spec, res)
            results.append(res)
        for job in eval_jobs:
            evals.append(evaljobs.run_eval(job, out_dir, progress))
    except KeyboardInterrupt:
        interrupted = True
        if progress.bar is not None:
            progress.bar.close()
        print("\ninterrupted: writing a partial report", file=sys.stderr)

    records = [r for res in results for r in res.records]
    selected_ids = {s["nodeid"] for res in results for s in res.collection.get("selected", [])}
    dropped = {}
    for res in results:
        for d in res.collection.get("dropped", []):
            if d["nodeid"] not in selected_ids:
                dropped.setdefault(d["nodeid"], d)
    dropped = list(dropped.values()) + [u for res in results for u in res.unfinished]
    tiers = tally.summarise_tiers(plans, records, dropped, subject=impl)
    dtypes = tally.summarise_dtypes(records, subject=impl)
    tot = tally.totals(records)
    runs_out = []
    for res in results:
        runs_out.append({"name": res.spec.name, "tiers": res.spec.tiers,
                         "exclude": res.spec.exclude, "workers": res.spec.workers,
                         "command": res.command, "exit_status": res.exit_status,
                         "wall_s": res.wall_s, "log": res.log,
                         "selected": len(res.collection.get("selected", [])),
                         "collect_errors": res.session.get("collect_errors", 0),
                         "problem": sessions.run_problem(res)})
    from .plugin import CLAUSES
    from .verdicts import by_severity, clause_table

    # worst first: defects, then weaker precision, limitations, conventions (.verdicts)
    failures = by_severity([
        {"nodeid": r["nodeid"], "tiers": r.get("tiers", []), "outcome": r["outcome"],
         "clause": r.get("clause"), "phase": r.get("phase"), "message": r.get("message", ""),
         "text": r.get("text", ""), "severity": r.get("severity"), "repro": r.get("repro")}
        for r in records if r["outcome"] in ("failed", "error")])
    contract = clause_table([r for r in records if "conformance" in r.get("tiers", ())],
                            CLAUSES)
    # the self-check's tests run the conformance tier per mutant: left out of every tier by
    # design (dcp-a2a self-check runs them); anything else without a tier is worth a note
    selfcheck = [d["nodeid"] for d in dropped if not d["tiers"] and "selfcheck" in d["markers"]]
    untiered = [d["nodeid"] for d in dropped if not d["tiers"] and d["nodeid"] not in selfcheck]

    failed = (any(t.status == "failed" for t in tiers) or bool(failures)
              or any(r["problem"] for r in runs_out) or any(e.status == "failed" for e in evals))
    requested_not_run = [p.name for p in plans if requested and p.name in requested and not p.run]
    # --evals (or --tiers e2e) asks for the model-level jobs too: one that cannot run is not a pass
    requested_not_run += [f"evals:{e.name}" for e in evals if e.status == "not run"]
    # a PASS needs something validated: not when no test passed at all (a -k that selects
    # nothing, every test skipped), nor when a tier asked for by name passed none
    validated = tot["passed"] + tot["xpassed"] + sum(e.status == "passed" for e in evals)
    nothing_validated = [f"{t.name} ({t.status})" for t in tiers
                         if requested and t.name in requested and t.status in ("no tests",
                                                                              "skipped")]
    if not validated:
        nothing_validated = ["no test passed"] + nothing_validated
    code = exit_status(interrupted=interrupted, failed=failed,
                       requested_not_run=requested_not_run, nothing_validated=nothing_validated)
    ran = [t for t in tiers if t.status != "not run"]
    worst = max((t.worst_ratio for t in ran if t.worst_ratio is not None), default=None)

    report = {
        "schema": "dcp_a2a.validation/1",
        "ok": code == EXIT_OK,
        "exit_status": code,
        "interrupted": interrupted,
        "started_at": started,
        "wall_s": time.monotonic() - t_start,
        "command": ["dcp-a2a"] + args.argv,
        "implementation": {"spec": impl, "module": impl_obj.module, "file": impl_obj.file,
                           "missing": missing, "described": impl_obj.describe(),
                           "surfaces": sorted(impl_obj.surfaces),
                           "envelope": impl_obj.envelope.describe()},
        "contract": contract,
        "options": {"impl": impl, "impl_missing": missing,
                    "tiers": requested, "quick": args.quick, "no_slow": args.no_slow,
                    "evals": args.evals,
                    "workers": args.workers, "out": str(out_dir), "pytest_args": extra,
                    "suite": str(suite.root), "suite_args": list(suite.args),
                    "gsm8k_limit": args.gsm8k_limit, "eval_model": args.eval_model},
        "machine": machine,
        "tiers": [tally.as_plain(t) for t in tiers],
        "totals": tot,
        "slowest_tests": tally.slowest(records),
        "worst_ratio": worst,
        "headroom": tally.headroom(worst),
        "requested_not_run": requested_not_run,
        "nothing_validated": nothing_validated,
        "untiered_tests": untiered,
        "selfcheck_tests": selfcheck,
        "dtypes": dtypes,
        "evals": [tally.as_plain(e) for e in evals],
        "runs": runs_out,
        "failures": failures,
        "tests": [{k: v for k, v in r.items() if k != "event"} | {
            "merge_reports": [{k: v for k, v in m.items()
                               if k not in ("ulp_histogram", "ratio_histogram")}
                              for m in r.get("merge_reports") or ()]} for r in records],
        "paths": {"json": str(out_dir / "validation.json"),
                  "markdown": str(out_dir / "validation.md"), "png": {}},
    }
    if not args.no_plots and dtypes:
        report["paths"]["png"] = rep.plot_ulp_histograms(dtypes, out_dir)
        if not report["paths"]["png"]:
            print("note: matplotlib is not installed, no PNGs (pip install -e .[report])",
                  file=sys.stderr)
    report["wall_s"] = time.monotonic() - t_start
    rep.write_json(report, out_dir / "validation.json")
    rep.write_markdown(report, out_dir / "validation.md")
    print(rep.summary_table(report), flush=True)
    if untiered:
        print(f"note: {len(untiered)} test(s) carry no tier marker and sit in no tests/<tier>/ "
              f"directory; they were not run (listed in validation.json: untiered_tests)")
    if selfcheck:
        print(f"note: the {len(selfcheck)} self-check tests belong to no tier by design (they "
              f"run the conformance tier against every mutant; run them with "
              f"`dcp-a2a self-check`)")
    if code == EXIT_NOTHING_VALIDATED:
        print(f"nothing validated: {', '.join(nothing_validated)} (exit status 5: not a pass)")
    if requested_not_run:
        print(f"asked for but cannot run here: {', '.join(requested_not_run)} (exit status 3)")
        for e in evals:
            if e.status == "not run":
                print(f"  evals:{e.name}: {e.reason}")
    return code
