"""``dcp-a2a`` command line (also ``python -m dcp_a2a``).

``dcp-a2a validate`` runs every test tier this machine supports and writes a report; see
docs/validate.md and :mod:`dcp_a2a.testing.validate` for how tiers are chosen and counted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .gpucheck import STEPS as GPU_CHECK_STEPS

# exit statuses of ``validate``
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_RUN, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_NOTHING_VALIDATED = 5  # pytest's "no tests ran"


def _tier_list(value: str) -> list[str]:
    from .validate import TIERS

    tiers = [t.strip() for t in value.split(",") if t.strip()]
    bad = [t for t in tiers if t not in TIERS]
    if bad or not tiers:
        raise argparse.ArgumentTypeError(
            f"unknown tier(s) {', '.join(bad) or '(none)'}; choose from {', '.join(TIERS)}")
    return tiers


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def _non_negative_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}")
    if not x >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {value}")
    return x


def eval_backends() -> tuple[str, ...]:
    """What the GSM8K driver accepts (its module imports lm-eval, too heavy to ask before the
    arguments are checked; tests/cli/test_verdicts.py keeps the two equal)."""
    from .. import BACKENDS

    return ("reference",) + BACKENDS


def _eval_backends(value: str) -> str:
    known = eval_backends()
    names = [b.strip() for b in value.split(",") if b.strip()]
    bad = [b for b in names if b not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown backend(s) {', '.join(bad) or '(none)'}; choose from {', '.join(known)}")
    return ",".join(names)


def _eval_model(value: str) -> str:
    from ..evals.model import MODELS

    if value not in MODELS:
        raise argparse.ArgumentTypeError(
            f"unknown model {value!r}; choose from {', '.join(MODELS)}")
    return value


def _workers(value: str):
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers takes a number or 'auto', got {value!r}")
    if n < 0:
        raise argparse.ArgumentTypeError("--workers must be >= 0")
    return n


def _version() -> str:
    """``dcp-a2a X.Y.Z (path)``: which installation answers, as `pip -V` says it."""
    import dcp_a2a

    return f"dcp-a2a {dcp_a2a.__version__} ({Path(dcp_a2a.__file__).parent})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dcp-a2a", description="dcp_a2a: the packed all-to-all combine for Decode Context "
                                    "Parallel attention, and its validation suite.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    v = sub.add_parser(
        "validate", help="run every test tier this machine supports and write a report",
        description="Detect the machine (CPU, GPUs, eval model, GSM8K data), run each test tier "
                    "that can run here, print a summary and write DIR/validation.json, "
                    "DIR/validation.md and DIR/ulp_<dtype>.png. Exit status: 0 all ran tiers "
                    "passed, 1 a failure, 2 usage error (an empty or unusable --impl too), 3 "
                    "something asked for cannot run here (a tier named in --tiers, or the evals "
                    "of --evals), 5 nothing validated (no test passed, or a tier named in "
                    "--tiers passed none), 130 interrupted.")
    v.add_argument("--impl", default=None, metavar="SPEC",
                   help="implementation under test, package.module[:attr] (default: "
                        "$DCP_A2A_IMPL or dcp_a2a; an empty value is refused); passed to pytest "
                        "as --impl. Under another implementation than dcp_a2a only the tests "
                        "that exercise it run")
    v.add_argument("--tiers", type=_tier_list, default=None, metavar="T1,T2",
                   help="tiers to run (unit,kernel,multiproc,conformance,numerics,gpu,multigpu,"
                        "e2e); default: every tier this machine supports")
    v.add_argument("--quick", action="store_true",
                   help="fast pre-commit subset: unit, kernel and conformance tests that need "
                        "neither process groups (multiproc) nor numerics, no slow tests, one case "
                        "per test function")
    v.add_argument("--no-slow", action="store_true",
                   help="leave out tests marked slow (counted as not run in their tiers)")
    v.add_argument("--evals", action="store_true",
                   help="also run the e2e tier: its tests, logit parity and a GSM8K subset "
                        "(needs the eval model and data)")
    v.add_argument("--gsm8k-dir", type=Path, default=None, metavar="DIR",
                   help="GSM8K JSONL directory (default: $DCP_A2A_GSM8K_DIR or "
                        "../shared/data/gsm8k next to the repo)")
    v.add_argument("--gsm8k-limit", type=_positive_int, default=None, metavar="K",
                   help="questions in the GSM8K subset with --evals (default 50 on a GPU, 10 on "
                        "CPU: ~10 s a question per backend there)")
    v.add_argument("--gsm8k-backends", type=_eval_backends, default="reference,packed",
                   metavar="B1,B2",
                   help="backends compared on GSM8K, the first is the baseline "
                        "(default reference,packed)")
    v.add_argument("--eval-model", type=_eval_model, default=None, metavar="NAME",
                   help="model of the end-to-end evals (a registered one, prepared with "
                        "python -m dcp_a2a.evals.prepare --model NAME; default: the strongest "
                        "prepared one)")
    v.add_argument("--out", type=Path, default=Path("validation-report"), metavar="DIR",
                   help="report directory (default ./validation-report)")
    v.add_argument("-j", "--workers", type=_workers, default=None, metavar="N",
                   help="pytest-xdist workers ('auto' = one per CPU, 0 = no xdist; default auto "
                        "on CPU, 8 on a GPU machine, 0 with --quick: starting workers costs "
                        "more than the subset)")
    v.add_argument("--suite", type=Path, default=None, metavar="DIR",
                   help="directory holding tests/ (default: the checkout this package is in; "
                        "with only the installed package, its shipped conformance suite)")
    v.add_argument("--stall-timeout", type=_non_negative_float, default=None, metavar="S",
                   help="stop a pytest session in which no test starts or ends for S seconds "
                        "(a hang: the tests running then fail, the rest count as not run), "
                        "counted from collection (start-up and collection get at least 120 s); "
                        "0 never (default 600)")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    v.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    v.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS",
                   help="extra arguments for pytest after --, e.g. -- -k pack -x")
    g = sub.add_parser(
        "gpu-check", help="before merging, on a GPU machine: validate, the self-check, the "
                          "NCCL accuracy job on every GPU and a quick benchmark; one exit "
                          "status, one summary",
        description="Run `dcp-a2a validate` (every tier this machine supports), the self-check "
                    "(every mutant killed with the kernels compiled; the reference contract "
                    "passing), the accuracy job on every visible GPU over NCCL, and a quick "
                    "kernel benchmark; write DIR/gpu-check.md and print one summary. Exit "
                    "status: 0 all passed, 1 a step failed, 3 no CUDA GPU here, 5 every step "
                    "skipped (nothing checked).")
    g.add_argument("--out", type=Path, default=Path("gpu-check"), metavar="DIR",
                   help="report directory (default ./gpu-check)")
    g.add_argument("-j", "--workers", type=_workers, default=None, metavar="N",
                   help="pytest-xdist workers for the validate step and the self-check's "
                        "contract run (default 8 on a GPU machine)")
    g.add_argument("--skip", nargs="+", choices=GPU_CHECK_STEPS, metavar="STEP",
                   help=f"leave out steps ({', '.join(GPU_CHECK_STEPS)}); the summary names "
                        "them and never reads as a full pass")
    return p


class _Stream:
    """Plain pass-through to a terminal stream: tqdm given ``sys.stderr`` itself stayed silent on
    some ptys here; through this wrapper it draws."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s):
        return self.stream.write(s)

    def flush(self):
        return self.stream.flush()

    def isatty(self):
        return True


class Progress:
    """A tqdm bar per pytest session on a terminal; periodic lines elsewhere (CI logs)."""

    def __init__(self, enabled: bool, stream=None):
        self.stream = stream or sys.stderr
        self.tty = enabled and self.stream.isatty()
        self.enabled = enabled
        self.bar = None
        self.done = 0
        self.total = None
        self.fails = 0
        self.skips = 0
        self.last_line = 0.0

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.bar.fp)
        else:
            print(text, file=self.stream, flush=True)

    def start_run(self, spec) -> None:
        self.done, self.total, self.fails, self.skips = 0, None, 0, 0
        self.t0 = time.monotonic()
        label = f"{spec.name} [{','.join(spec.tiers)}]"
        if self.tty:
            from tqdm import tqdm

            import shutil

            wide = shutil.get_terminal_size((0, 0)).columns >= 40
            self.bar = tqdm(total=None, desc=f"{label} collecting", unit="test",
                            file=_Stream(self.stream), dynamic_ncols=wide, ncols=None if wide else 100,
                            leave=True)
            self.label = label
        else:
            self.label = label
            self.message(f"{label}: collecting (pytest -n {spec.workers or 0})")

    def collected(self, spec, collection: dict) -> None:
        self.total = len(collection.get("selected", []))
        if self.bar is not None:
            self.bar.reset(total=self.total)
            self.bar.update(self.done)
            self.bar.set_description(self.label)
        else:
            self.message(f"{self.label}: {self.total} tests selected "
                         f"({len(collection.get('dropped', []))} left out)")

    def test_done(self, spec, rec: dict) -> None:
        self.done += 1
        oc = rec.get("outcome")
        if oc in ("failed", "error"):
            self.fails += 1
            self.message(f"  {oc.upper()} {rec['nodeid']}")
        elif oc == "skipped":
            self.skips += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(fail=self.fails, skip=self.skips, refresh=False)
        elif self.enabled and time.monotonic() - self.last_line > 20:
            self.last_line = time.monotonic()
            self.message(f"{self.label}: {self.done}/{self.total or '?'} done, "
                         f"{self.fails} failed, {self.skips} skipped")

    def end_run(self, spec, result) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.message(f"{self.label}: {self.done} tests in {result.wall_s:.1f}s, "
                     f"{self.fails} failed, {self.skips} skipped (pytest exit {result.exit_status})")


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


def validate(args) -> int:
    from . import report as rep
    from . import validate as val
    from .cores import available_cores

    t_start = time.monotonic()
    started = val.now_iso()
    if args.suite is not None and not (args.suite / "tests").is_dir():
        print(f"dcp-a2a validate: --suite {args.suite}: no tests/ directory there",
              file=sys.stderr)
        return EXIT_USAGE
    from .impl import load_impl, resolve_spec
    from .outpaths import dir_problem

    try:
        impl_obj = load_impl(resolve_spec(args.impl))
        impl = impl_obj.spec  # module form: the pytest sessions run elsewhere
    except ValueError as e:
        print(f"dcp-a2a validate: {e}", file=sys.stderr)
        return EXIT_USAGE
    missing = impl_obj.missing()
    out_dir = args.out.resolve()
    problem = dir_problem(out_dir)
    if problem:
        print(f"dcp-a2a validate: --out {args.out}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    out_dir.mkdir(parents=True, exist_ok=True)
    suite = val.find_suite(args.suite)

    machine = val.detect_machine(args.gsm8k_dir, args.eval_model)
    requested = args.tiers
    if requested and "e2e" in requested:
        args.evals = True
    plans = val.plan_tiers(machine, requested, args.evals, quick=args.quick)
    if args.workers is None:
        # a CUDA context per worker (and a pool of GPU ranks for the multi-process tests):
        # on a GPU machine a few workers, not one per core
        gpu_cap = min(val.GPU_WORKERS, available_cores())
        args.workers = 0 if args.quick else (gpu_cap if machine["cuda_device_count"] else "auto")
    runs = val.plan_runs(plans, args.workers if machine["modules"]["xdist"] else None)
    if args.no_slow:
        for spec in runs:
            spec.exclude = sorted(set(spec.exclude) | {"slow"})
    extra = list(args.pytest_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]

    progress = Progress(not args.no_progress)
    progress.message(
        f"dcp-a2a validate: impl {impl_obj.describe()}, device {machine['device']} "
        f"(x{machine['cuda_device_count']}), triton {machine['triton_mode']}; report -> {out_dir}")
    if missing:
        progress.message(f"  note: {impl} lacks {', '.join(missing)}; tests needing them skip")
    for p in plans:
        progress.message(f"  {p.name:<12} {'run' if p.run else 'not run: ' + p.reason}")
    eval_jobs = []
    if args.evals:
        limit = args.gsm8k_limit or (50 if machine["cuda_device_count"] else 10)
        eval_jobs = val.plan_evals(machine, out_dir, limit, args.gsm8k_backends, impl)
        for job in eval_jobs:
            if job.reason:
                progress.message(f"  evals:{job.name:<6} not run: {job.reason}")

    results = []
    evals = []
    interrupted = False
    try:
        for spec in runs:
            progress.start_run(spec)
            res = val.run_pytest(spec, out_dir, impl=impl, quick=args.quick, extra=extra,
                                 progress=progress, suite=suite,
                                 stall_s=(val.STALL_TIMEOUT_S if args.stall_timeout is None
                                          else args.stall_timeout))
            progress.end_run(spec, res)
            results.append(res)
        for job in eval_jobs:
            evals.append(val.run_eval(job, out_dir, progress))
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
    tiers = val.summarise_tiers(plans, records, dropped, subject=impl)
    dtypes = val.summarise_dtypes(records, subject=impl)
    tot = val.totals(records)
    runs_out = []
    for res in results:
        runs_out.append({"name": res.spec.name, "tiers": res.spec.tiers,
                         "exclude": res.spec.exclude, "workers": res.spec.workers,
                         "command": res.command, "exit_status": res.exit_status,
                         "wall_s": res.wall_s, "log": res.log,
                         "selected": len(res.collection.get("selected", [])),
                         "collect_errors": res.session.get("collect_errors", 0),
                         "problem": run_problem(res)})
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
    # design (python -m dcp_a2a.testing.selfcheck runs them); anything else without a tier is
    # worth a note
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
    if interrupted:
        code = EXIT_INTERRUPTED
    elif failed:
        code = EXIT_FAILED
    elif requested_not_run:
        code = EXIT_NOT_RUN
    elif nothing_validated:
        code = EXIT_NOTHING_VALIDATED
    else:
        code = EXIT_OK
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
        "tiers": [val.as_plain(t) for t in tiers],
        "totals": tot,
        "slowest_tests": val.slowest(records),
        "worst_ratio": worst,
        "headroom": val.headroom(worst),
        "requested_not_run": requested_not_run,
        "nothing_validated": nothing_validated,
        "untiered_tests": untiered,
        "selfcheck_tests": selfcheck,
        "dtypes": dtypes,
        "evals": [val.as_plain(e) for e in evals],
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
              f"`python -m dcp_a2a.testing.selfcheck`)")
    if code == EXIT_NOTHING_VALIDATED:
        print(f"nothing validated: {', '.join(nothing_validated)} (exit status 5: not a pass)")
    if requested_not_run:
        print(f"asked for but cannot run here: {', '.join(requested_not_run)} (exit status 3)")
        for e in evals:
            if e.status == "not run":
                print(f"  evals:{e.name}: {e.reason}")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # what the report says was run (main may be called with its own list)
    if args.command == "validate":
        return validate(args)
    if args.command == "gpu-check":
        from . import gpucheck

        return gpucheck.main(args)
    parser.print_help()
    return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
