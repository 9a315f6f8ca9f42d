"""``dcp-a2a engines``: the conformance suite over every engine it can load, one table.

For each engine adapter (``dcp_a2a.testing.adapters``: vLLM, SGLang, FlashInfer, and their
variants), installed here or given as a downloaded release (``--releases DIR`` holding the wheels
``pip download --no-deps vllm==0.34.0 sglang==0.5.23 flashinfer-python -d DIR`` fetched, or
``--engine vllm=PATH`` one by one), it runs ``dcp-a2a validate --impl SPEC --tiers conformance``
in a process of its own (an engine that crashes takes only its own run down) and reads the
report back. Then it writes ``DIR/engines.md`` and ``DIR/engines.json``: a table engine x
clause -- passed, failed (by severity: defect, precision, limitation, convention), not
applicable (a surface the engine does not expose) -- and, for every failing clause, its worst
failure with a minimal reproducer (a few lines of Python with the numbers) and the verdict.

An engine that cannot be loaded here (not installed, no release given, a variant that needs
more GPUs than this machine has) is listed with the one-line reason, never counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .verdicts import ORDER, by_severity, rank

# the clauses in the order the table shows them
CLAUSE_ORDER = ("merge bound", "wire format", "masking", "exchange", "caller buffer",
                "up-projection", "bad input", "graphs", "envelope")
# engines whose Triton kernels walk their lanes one scalar at a time: under Triton's CPU
# interpreter the suite would take hours (a GPU runs them; --engine runs them here anyway)
SCALAR_KERNELS = {
    "flashinfer": "not run on the CPU: FlashInfer's Triton cascade kernel loops over lanes and "
                  "heads one scalar at a time, so one merge of B=4 H=8 D=64 N=4 takes about "
                  "40 s in Triton's interpreter and the suite hours (run it on a GPU, or "
                  "name it with --engine)",
}
MAX_SESSIONS = 6  # sessions an engine's run may take (each goes on where a crash stopped one)
SEVERITY_WORDS = {"defect": "defect", "precision": "weaker precision",
                  "limitation": "valid input refused", "convention": "difference of convention"}


@dataclass
class EngineRun:
    spec: str                        # what --impl received
    name: str                        # the column's title
    status: str = "not run"          # "ran", "not loaded", "not run"
    reason: str = ""                 # why not, in one line
    described: str = ""              # the adapter's ENGINE line and file
    surfaces: list = field(default_factory=list)
    envelope: str = ""
    exit_status: int | None = None
    wall_s: float = 0.0
    report: str = ""                 # its validation.json
    sessions: int = 0                # validate sessions it took (a crash ends one early)
    tests: int = 0                   # tests that ran, over all of them
    clauses: dict = field(default_factory=dict)   # clause -> row of verdicts.clause_table
    worst: dict = field(default_factory=dict)     # clause -> the failure shown for it
    defects: list = field(default_factory=list)   # every defect, worst first


DOC_BEGIN = "<!-- engines table: {where} -->"
DOC_END = "<!-- end of the engines table: {where} -->"


def add_arguments(p) -> None:
    p.add_argument("--engine", action="append", default=None, metavar="SPEC",
                   help="an engine to run, as --impl takes it (vllm, sglang:ag_rs_mha, "
                        "flashinfer=PATH ...); repeatable. Default: every engine and variant of "
                        "dcp_a2a.testing.adapters, from --releases when given, else installed")
    p.add_argument("--releases", type=Path, default=None, metavar="DIR",
                   help="a folder of downloaded releases (pip download --no-deps vllm==0.34.0 "
                        "sglang==0.5.23 flashinfer-python -d DIR): each engine's wheel is read "
                        "from there without installing it")
    p.add_argument("--out", type=Path, default=Path("engines-report"), metavar="DIR",
                   help="where engines.md, engines.json and each engine's validation report go "
                        "(default ./engines-report)")
    p.add_argument("--tiers", default="conformance", metavar="T1,T2",
                   help="the tiers each engine runs (default conformance: every clause)")
    p.add_argument("-j", "--workers", default="2", metavar="N",
                   help="pytest-xdist workers of each engine's run (default 2; at least 1: a "
                        "worker that crashes is replaced, the run goes on)")
    p.add_argument("--doc", type=Path, default=None, metavar="FILE",
                   help="also put the table and each engine's defects (no reproducers: the "
                        "report folder keeps them) in FILE, between its markers "
                        f"'{DOC_BEGIN.format(where='CPU')}' and "
                        f"'{DOC_END.format(where='CPU')}' (GPU on a GPU machine)")
    p.add_argument("--from-report", type=Path, nargs="+", default=None, metavar="JSON",
                   help="run nothing: render earlier runs' engines.json files as one table "
                        "(runs of one engine each, on one machine; with --doc: into FILE, "
                        "under the machine they ran on)")


def _column(spec: str) -> str:
    head, _, path = spec.partition("=")
    return head if not path else f"{head} (release)"


def default_specs(releases: Path | None) -> list[tuple[str, str | None]]:
    """[(spec, reason it cannot run here or None)] of every engine variant: from the releases
    in ``releases`` when given, else as installed here."""
    from .adapters import ENGINE_VARIANTS, GPUS_NEEDED, find_release
    from .rankpool import gpu_count

    gpus = gpu_count()
    out = []
    for engine, variants in ENGINE_VARIANTS.items():
        path = find_release(engine, releases) if releases is not None else None
        for i, variant in enumerate(variants):
            head = engine if i == 0 else f"{engine}:{variant}"
            need = GPUS_NEEDED.get((engine, variant), 0)
            if releases is not None and path is None:
                out.append((head, f"no {engine} release in {releases}"))
            elif need > gpus:
                out.append((head, f"needs >= {need} CUDA GPUs, this machine has {gpus} "
                                  "(written for any N; not run)"))
            elif not gpus and engine in SCALAR_KERNELS:
                out.append((head, SCALAR_KERNELS[engine]))
            else:
                out.append((head if path is None else f"{head}={path}", None))
    return out


def _probe(spec: str) -> tuple[dict | None, str | None]:
    """Load ``spec`` in a child process: (facts, None) or (None, the one-line reason)."""
    code = ("import json,sys\nfrom dcp_a2a.testing.impl import load_impl\n"
            "try:\n    i = load_impl(sys.argv[1])\nexcept ValueError as e:\n"
            "    print(json.dumps({'error': str(e)})); sys.exit(0)\n"
            "print(json.dumps({'described': i.describe(), 'surfaces': sorted(i.surfaces), "
            "'envelope': i.envelope.describe(), 'spec': i.spec}))\n")
    proc = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"loading it failed (exit {proc.returncode}): {err}"
    facts = json.loads(lines[-1])
    if "error" in facts:
        return None, facts["error"].splitlines()[0]
    return facts, None


def run_engine(spec: str, out_dir: Path, tiers: str, workers: str) -> EngineRun:
    run = EngineRun(spec=spec, name=_column(spec))
    facts, why = _probe(spec)
    if facts is None:
        run.status, run.reason = "not loaded", why
        return run
    run.described, run.surfaces, run.envelope = (facts["described"], facts["surfaces"],
                                                 facts["envelope"])
    run.spec = facts["spec"]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec.partition("=")[0])
    target = out_dir / safe
    t0 = time.monotonic()
    from .lostcontext import NOT_RUN

    records: dict[str, dict] = {}
    left: dict[str, dict] = {}
    for part in range(MAX_SESSIONS):
        # a session an engine's crash or a worker's loss ended early goes on in the next one,
        # without the tests that ran (the crashed one included: it has its record)
        done = target / f"ran-before-session-{part}.txt"
        target.mkdir(parents=True, exist_ok=True)
        done.write_text("\n".join(sorted(records)) + "\n")
        out = target / f"session-{part}"
        cmd = [sys.executable, "-m", "dcp_a2a", "validate", "--impl", run.spec, "--tiers", tiers,
               "--out", str(out), "--no-plots", "--no-progress", "-j", str(workers), "--",
               "--dcp-deselect", str(done)]
        log = target / f"session-{part}.log"
        with open(log, "w") as fh:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
        run.exit_status = proc.returncode if run.exit_status in (None, 0) else run.exit_status
        rep_path = out / "validation.json"
        if not rep_path.is_file():
            run.reason = f"validate wrote no report (exit {proc.returncode}, log {log})"
            break
        rep = json.loads(rep_path.read_text())
        run.report = str(rep_path)
        tests = [r for r in rep.get("tests") or [] if r["nodeid"] not in records]
        # skipped in a process whose CUDA context an earlier test destroyed: not run, so the
        # next session runs them, in fresh processes
        left = {r["nodeid"]: r for r in tests if (r.get("text") or "").startswith(NOT_RUN)}
        fresh = [r for r in tests if r["nodeid"] not in left]
        records.update({r["nodeid"]: r for r in fresh})
        unfinished = sum(t.get("unfinished", 0) for t in rep.get("tiers") or []) + len(left)
        run.sessions = part + 1
        if not unfinished or not fresh:
            break
    records.update(left)  # those no session got to: counted as the skips they are
    run.wall_s = time.monotonic() - t0
    if not records:
        run.status = "not run"
        return run
    from .plugin import CLAUSES
    from .verdicts import clause_table

    recs = list(records.values())
    run.status = "ran"
    run.tests = len(recs)
    run.clauses = {row["clause"]: row for row in clause_table(
        [r for r in recs if "conformance" in (r.get("tiers") or ())], CLAUSES)}
    failures = by_severity([r for r in recs if r.get("outcome") in ("failed", "error")])
    for clause in run.clauses:
        mine = [f for f in failures if f.get("clause") == clause]
        if mine:
            worst = min(rank(f["severity"], f["why"], clause) for f in mine)
            tier = [f for f in mine if rank(f["severity"], f["why"], clause) == worst]
            with_repro = [f for f in tier if (f.get("repro") or {}).get("script")]
            pick = min(with_repro, key=lambda f: f["repro"].get("size", 0)) if with_repro \
                else tier[0]
            run.worst[clause] = _shown(pick)
    run.defects = [_shown(f) for f in failures if f["severity"] == "defect"]
    return run


def _shown(f: dict) -> dict:
    msg = (f.get("message") or "").strip().splitlines()
    return {"nodeid": f["nodeid"], "severity": f["severity"], "why": f.get("why", ""),
            "message": msg[0][:300] if msg else "", "clause": f.get("clause"),
            "repro": (f.get("repro") or {}).get("script")}


def cell(row: dict | None) -> str:
    """One table cell: passed (k) / failed: n defects, ... / not applicable / outside envelope."""
    if row is None:
        return "not run"
    failed = {s: n for s, n in row["failed"].items() if n}
    if failed:
        parts = [f"{n} {s}{'s' if n > 1 else ''}" for s, n in
                 sorted(failed.items(), key=lambda kv: ORDER[kv[0]])]
        return "**failed**: " + ", ".join(parts) + f" (of {row['judged']})"
    if row["passed"]:
        extra = f"; {row['outside']} outside envelope" if row["outside"] else ""
        return f"passed ({row['passed']}{extra})"
    if row["not_applicable"]:
        # each skip names the surfaces its test needs ("wire", "wire, masking"): each once
        missing = dict.fromkeys(s for why in row["not_applicable_why"] for s in why.split(", "))
        return "not applicable: " + ", ".join(missing)
    if row.get("limits"):
        return "limit reported"
    if row["outside"]:
        return "outside envelope"
    return "skipped" if row["skipped"] else "not run"


def doc_markers(doc: Path, machine: str) -> tuple[str, str]:
    """The markers in ``doc`` between which a table of this kind of machine (CPU or GPU)
    goes; ValueError naming them when ``doc`` lacks them."""
    where = "CPU" if machine.startswith("CPU") else "GPU"
    begin, end = DOC_BEGIN.format(where=where), DOC_END.format(where=where)
    text = doc.read_text()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{doc}: expected one '{begin}' and one '{end}' after it")
    return begin, end


def write_doc(doc: Path, md: str, machine: str) -> None:
    """Put ``md`` between ``doc``'s markers of this kind of machine."""
    begin, end = doc_markers(doc, machine)
    head, rest = doc.read_text().split(begin, 1)
    doc.write_text(f"{head}{begin}\n\n{md.strip()}\n\n{end}{rest.split(end, 1)[1]}")


def render_markdown(runs: list[EngineRun], machine: str, reproducers: bool = True) -> str:
    ran = [r for r in runs if r.status == "ran"]
    L = [f"## Engine x clause ({machine})", ""]
    if ran:
        L.append("| clause | " + " | ".join(f"`{r.name}`" for r in ran) + " |")
        L.append("|---|" + "---|" * len(ran))
        clauses = [c for c in CLAUSE_ORDER if any(c in r.clauses for r in ran)]
        clauses += sorted({c for r in ran for c in r.clauses} - set(clauses))
        for c in clauses:
            L.append(f"| {c} | " + " | ".join(cell(r.clauses.get(c)) for r in ran) + " |")
        L += ["", "| engine | what ran | surfaces | envelope | tests | sessions | time |",
              "|---|---|---|---|--:|--:|--:|"]
        for r in ran:
            L.append(f"| `{r.name}` | {r.described} | {', '.join(r.surfaces)} | {r.envelope} | "
                     f"{r.tests} | {r.sessions} | {r.wall_s:.0f} s |")
    skipped = [r for r in runs if r.status != "ran"]
    if skipped:
        L += ["", "Not run here:", ""]
        L += [f"- `{r.spec}`: {r.reason}" for r in skipped]
    for r in ran:
        L += ["", f"### `{r.name}`", "", f"{r.described}", ""]
        if r.defects:
            L.append(f"**Defects ({len(r.defects)})**, worst first (memory unsafety, wrong "
                     "numbers from valid input, then bad input let through):")
            L.append("")
            seen, garbage = set(), []
            for d in r.defects:
                if d["why"].startswith("garbage accepted"):
                    garbage.append(d)
                    continue
                key = (d["clause"], d["message"][:60])
                if key in seen:
                    continue
                seen.add(key)
                L.append(f"- {d['clause'] or '-'}: `{d['nodeid']}` ({d['why']}): {d['message']}")
            if garbage:
                names = sorted({d["nodeid"].split("::")[-1].split("[")[0] for d in garbage})
                L.append(f"- bad input let through, {len(garbage)} cases ({', '.join(names)}): "
                         f"e.g. {garbage[0]['message']}")
            L.append("")
        for c in CLAUSE_ORDER:
            w = r.worst.get(c)
            if not w:
                continue
            L += [f"**{c}**: {SEVERITY_WORDS[w['severity']]} ({w['why']}), `{w['nodeid']}`",
                  "", f"> {w['message']}", ""]
            if w["repro"] and reproducers:
                L += ["```python", w["repro"].rstrip(), "```", ""]
    return "\n".join(L) + "\n"


def _machine() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, torch " \
               f"{torch.__version__}"
    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = "absent"
    return f"CPU, Triton {tv} interpreter, torch {torch.__version__}"


def read_reports(paths) -> tuple[str, list[EngineRun]]:
    """(machine, runs) of earlier runs' engines.json files, in the order given; ValueError where
    one is not such a report, where they ran on different machines, or where two hold the same
    engine spec (one table keeps one column an engine)."""
    machine, runs, seen = None, [], {}
    for path in paths:
        try:
            rep = json.loads(Path(path).read_text())
            here = rep["machine"]
            more = [EngineRun(**r) for r in rep["runs"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not an engines.json of dcp-a2a engines ({e})") from None
        if machine is not None and here != machine:
            raise ValueError(f"{path} ran on {here!r}, {paths[0]} on {machine!r}: one table "
                             "holds one machine's runs")
        machine = here
        for r in more:
            if r.spec in seen:
                raise ValueError(f"{r.spec} is in both {seen[r.spec]} and {path}")
            seen[r.spec] = path
        runs += more
    return machine, runs


def main(args) -> int:
    """Exit status: 0 every engine ran and passed, 1 some engine failed a clause, 5 no engine
    could be run here, 2 usage error."""
    reports = None
    if args.from_report is not None:
        try:
            reports = read_reports(args.from_report)
        except ValueError as e:
            print(f"dcp-a2a engines: error: argument --from-report: {e}", file=sys.stderr)
            return 2
    if args.doc is not None:  # before any run: a doc without its place is a usage error
        try:
            doc_markers(args.doc, reports[0] if reports else _machine())
        except ValueError as e:
            print(f"dcp-a2a engines: error: argument --doc: {e}", file=sys.stderr)
            return 2
    if reports is not None:
        machine, runs = reports
        md = render_markdown(runs, machine, reproducers=args.doc is None)
        if args.doc is not None:
            write_doc(args.doc, md, machine)
        print(md)
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    specs = [(s, None) for s in args.engine] if args.engine else default_specs(args.releases)
    runs = []
    for spec, reason in specs:
        if reason:
            runs.append(EngineRun(spec=spec, name=_column(spec), status="not run",
                                  reason=reason))
            continue
        print(f"dcp-a2a engines: {spec} ...", flush=True)
        r = run_engine(spec, out, args.tiers, args.workers)
        print(f"  {r.status}" + (f": {r.reason}" if r.reason else
                                 f" (exit {r.exit_status}, {r.wall_s:.0f} s)"), flush=True)
        runs.append(r)
    machine = _machine()
    md = render_markdown(runs, machine)
    (out / "engines.md").write_text(md)
    (out / "engines.json").write_text(json.dumps(
        {"schema": "dcp_a2a.engines/1", "machine": machine,
         "runs": [asdict(r) for r in runs]}, indent=1))
    if args.doc is not None:
        write_doc(args.doc, render_markdown(runs, machine, reproducers=False), machine)
    print(md)
    print(f"report: {out / 'engines.md'}  {out / 'engines.json'}")
    ran = [r for r in runs if r.status == "ran"]
    if not ran:
        return 5
    return 1 if any(sum(row["failed"].values()) for r in ran for row in r.clauses.values()) \
        else 0


def cli(argv=None) -> int:
    """``python -m dcp_a2a.testing.engines``: the same program on its own."""
    import argparse

    p = argparse.ArgumentParser(prog="dcp-a2a engines", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return main(p.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli())
