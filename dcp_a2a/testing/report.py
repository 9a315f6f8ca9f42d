"""Writing the validation report: ``validation.json``, ``validation.md``, ``ulp_<dtype>.png`` and
the one-screen terminal summary. The fields are documented in docs/validate.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .validate import as_plain
from .verdicts import SEVERITIES

STATUS_MARK = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP", "no tests": "EMPTY",
               "not run": "--"}


def fmt_ratio(r) -> str:
    if r is None:
        return "-"
    r = float(r)
    if math.isinf(r):
        return "inf"
    return f"{r:.3f}" if r < 10 else f"{r:.3g}"


def fmt_headroom(h) -> str:
    if h is None:
        return "-"
    h = float(h)
    if math.isinf(h):
        return "exact"
    return f"{h:.3f}x" if h < 10 else f"{h:.3g}x"


def fmt_time(s: float) -> str:
    s = round(s, 1)  # before splitting: 119.97 s is 2m00.0s, not 1m60.0s
    if s < 60:
        return f"{s:.1f}s"
    return f"{int(s // 60)}m{s % 60:04.1f}s"


# --------------------------------------------------------------------------- terminal summary

def summary_table(report: dict) -> str:
    """The one-screen summary printed at the end of a run."""
    rows = [("tier", "status", "cases", "pass", "fail", "skip", "xfail", "err/tol", "headroom",
             "time")]
    notes = []
    for t in report["tiers"]:
        if t["status"] == "not run":
            notes.append(f"  {t['name']:<12} not run: {t['reason']}"
                         + (f" ({_n(t['not_run'], 'test')})" if t["not_run"] else ""))
            continue
        rows.append((t["name"], STATUS_MARK.get(t["status"], t["status"]), str(t["cases"]),
                     str(t["passed"] + t["xpassed"]), str(t["failed"]), str(t["skipped"]),
                     str(t["xfailed"]), fmt_ratio(t["worst_ratio"]),
                     fmt_headroom(t["headroom"]), fmt_time(t["time_s"])))
        extra = []
        if t["not_run"]:
            extra.append(f"{_n(t['not_run'], 'test')} not run: also in a tier not run here")
        if t.get("unfinished"):
            extra.append(f"{_n(t['unfinished'], 'test')} not run: the pytest session ended "
                         "early (it died or was stopped)")
        if t.get("other_code"):
            extra.append(f"{_n(t['other_code'], 'test')} of dcp_a2a's own code left out "
                         "(not the implementation under test)")
        if t["left_out"]:
            extra.append(f"{t['left_out']} left out by --quick")
        if t["status"] in ("skipped", "no tests") and t.get("reason"):
            extra.append(t["reason"])
        if extra:
            notes.append(f"  {t['name']:<12} " + "; ".join(extra))
    for e in report.get("evals", []):
        if e["status"] == "not run":
            notes.append(f"  {'evals:' + e['name']:<12} not run: {e['reason']}")
        else:
            rows.append(("evals:" + e["name"], STATUS_MARK.get(e["status"], e["status"]), "1",
                         str(int(e["status"] == "passed")), str(int(e["status"] == "failed")),
                         "0", "0", "-", "-", fmt_time(e["wall_s"])))
            if e["status"] == "failed":
                notes.append(f"  {'evals:' + e['name']:<12} failed: {e.get('reason') or '?'} "
                             f"(log: {e.get('log')})")
    tot = report["totals"]
    rows.append(("total", verdict_mark(report), str(tot["cases"]),
                 str(tot["passed"] + tot["xpassed"]),
                 str(tot["failed"] + tot["error"]), str(tot["skipped"]), str(tot["xfailed"]),
                 fmt_ratio(report.get("worst_ratio")), fmt_headroom(report.get("headroom")),
                 fmt_time(report["wall_s"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])] + [
            c.rjust(w) for c, w in zip(r[2:], widths[2:])]
        lines.append("  ".join(cells))
        if k == 0 or k == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    m = report["machine"]
    head = (f"dcp-a2a validate  on {describe_devices(m)}"
            f"  torch {m['torch']}  triton {m['triton']} ({m['triton_mode']})"
            + ("  [quick]" if report["options"]["quick"] else ""))
    out = [implementation_line(report), head, ""] + lines
    if notes:
        out += [""] + notes
    contract = report.get("contract") or []
    if any(r["judged"] or r["not_applicable"] or r["outside"] for r in contract):
        out += [""] + contract_lines(report)
    fails = report.get("failures", [])
    by_clause = failures_by_clause(fails)
    if by_clause:
        out += ["", "failures by contract clause: " + ", ".join(
            f"{c} {len(fs)}" for c, fs in by_clause.items())]
    if fails:
        out += ["", f"failures ({len(fails)}), worst first (defects, precision, limitations, "
                    "conventions), grouped by their first error line:"]
        groups: dict[tuple, list] = {}
        for f in fails:
            line = (f.get("message") or "").strip().splitlines()[:1]
            line = line[0][:160] if line else _first_error_line(f.get("text", ""))
            groups.setdefault((f.get("severity") or "defect", line), []).append(f)
        order = {s: i for i, s in enumerate(SEVERITIES)}
        ranked = sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 0), -len(kv[1])))
        for k, ((sev, line), fs) in enumerate(ranked):
            if k == 8:
                out.append(f"  ... {len(groups) - 8} more kinds (see validation.md)")
                break
            more = f" (+{len(fs) - 1} more like it)" if len(fs) > 1 else ""
            why = fs[0].get("why")
            out.append(f"  {sev.upper():10} {fs[0]['nodeid']}{more}"
                       + (f"  [{why}]" if why and why not in (sev, "wrong result") else ""))
            if line:
                out.append(f"             {line}")
    for r in report.get("runs", []):
        if r.get("problem"):
            out.append(f"\npytest session '{r['name']}': {r['problem']} (log: {r['log']})")
    out += ["", LEGEND,
            f"report: {report['paths']['markdown']}  {report['paths']['json']}"
            + "".join(f"  {p}" for p in report["paths"]["png"].values())]
    return "\n".join(out)


def contract_lines(report: dict) -> list[str]:
    """How much of the contract was judged, clause by clause: passed, failed by severity, not
    applicable (a surface the implementation does not expose) and outside its envelope."""
    impl = report["implementation"]
    rows = [("clause", "judged", "pass", "defect", "precision", "limit.", "conv.", "n/a",
             "outside")]
    for r in report.get("contract") or []:
        f = r["failed"]
        rows.append((r["clause"], str(r["judged"]), str(r["passed"]), str(f["defect"]),
                     str(f["precision"]), str(f["limitation"]), str(f["convention"]),
                     str(r["not_applicable"]), str(r["outside"])))
    widths = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    lines = [f"contract judged (surfaces exposed: {', '.join(impl.get('surfaces') or []) or 'none'}"
             f"; envelope: {impl.get('envelope', 'the whole contract')}):"]
    for k, x in enumerate(rows):
        lines.append("  " + "  ".join([x[0].ljust(widths[0])]
                                      + [c.rjust(w) for c, w in zip(x[1:], widths[1:])]))
    judged = [r["clause"] for r in report.get("contract") or [] if r["judged"]]
    idle = [r for r in report.get("contract") or [] if not r["judged"]]
    for r in idle:
        if r["not_applicable"]:
            lines.append(f"  {r['clause']}: not applicable ({'; '.join(r['not_applicable_why'])})")
        elif r["outside"]:
            lines.append(f"  {r['clause']}: every case outside the envelope")
    for r in report.get("contract") or []:
        for lim in r.get("limits") or []:
            lines.append(f"  envelope limit: {lim}")
    outside = sorted({w for r in report.get("contract") or [] for w in r["outside_why"]})
    if outside:
        lines.append("  outside the envelope, not judged: " + "; ".join(outside[:6])
                     + (f" (+{len(outside) - 6} more)" if len(outside) > 6 else ""))
    total = len(report.get("contract") or [])
    lines.append(f"  {len(judged)} of {total} clauses judged")
    return lines


def verdict_mark(report: dict) -> str:
    """The total row's status: PASS, EMPTY (nothing validated: exit status 5) or FAIL."""
    if report["ok"]:
        return "PASS"
    return "EMPTY" if report["exit_status"] == 5 else "FAIL"  # cli.EXIT_NOTHING_VALIDATED


def verdict_word(report: dict) -> str:
    return {"PASS": "passed", "EMPTY": "nothing validated", "FAIL": "FAILED"}[
        verdict_mark(report)]


def implementation_line(report: dict) -> str:
    """The first line of every summary: exactly whose code the numbers below measured, and what
    of the contract it lacks (a PASS of a partial implementation skipped those tests)."""
    i = report["implementation"]
    lacks = i.get("missing") or []
    return (f"implementation under test: {i['described']}"
            + (f"; lacks {', '.join(lacks)} (tests needing it skip)" if lacks else ""))


def failures_by_clause(fails: list[dict]) -> dict[str, list]:
    """Failed conformance tests per contract clause (their ``clause`` marker), largest first;
    failures of tests without a clause are not listed here."""
    groups: dict[str, list] = {}
    for f in fails:
        if f.get("clause"):
            groups.setdefault(f["clause"], []).append(f)
    return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))


LEGEND = ("err/tol: the worst error over the tolerance across the tier's merge checks "
          "(headroom = tol/err; 1.00x on 16-bit outputs is the best possible: their bound is "
          "half an ulp, and a correctly rounded result uses all of it). xfail: known-broken "
          "designs the tests must fail. time: the tier's summed test durations; total: wall "
          "clock.")


def describe_devices(machine: dict) -> str:
    """'CPU (no CUDA GPU)' or '2 x NVIDIA H200'."""
    n = machine["cuda_device_count"]
    if not n:
        return "CPU (no CUDA GPU)"
    names = sorted({g["name"] for g in machine["gpus"]})
    return f"{n} x {', '.join(names)}"


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def _first_error_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("E "):
            return ln[1:].strip()[:160]
    return lines[-1][:160] if lines else ""


# --------------------------------------------------------------------------- PNG per dtype

ULP_LINE_NOTE = (
    "The dashed line is the bound's rounding part only (half an ulp of {dt}); the bound adds E, "
    "an fp32 evaluation allowance that scales with M = sum w|o| (tolerances.yaml). Where M >> "
    "|y*| (an output made tiny by cancellation) E is many ulps of y*, so an element right of "
    "the line can still pass; for float32 outputs E is itself several fp32 ulps of M (the "
    "merge is evaluated in fp32), so most elements sit right of the line. The right panel, "
    "error over the whole bound, is the criterion: an element passes at <= 1.")


def plot_ulp_histograms(dtypes: dict, out_dir: Path) -> dict[str, str]:
    """``ulp_<dtype>.png``: per-element output errors (summed over every merge check of the
    run) in ulps of the dtype, one series per bound kind, with the bound's rounding part as a
    line (left), and as a ratio to the whole bound, the pass criterion (right)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    import textwrap

    from . import tolerances as tol

    t = tol.load()
    paths = {}
    for dt, d in dtypes.items():
        edges = [float(e) for e in d["bin_edges"]]
        n = len(edges) - 1
        labels = [_bin_label(edges[i], edges[i + 1]) for i in range(n)]
        try:
            rounding = float(t["a2a"][dt]["output"]["rounding_ulps"])
        except KeyError:
            rounding = None
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 5.2), dpi=110,
                                      gridspec_kw={"width_ratios": [2.2, 1]})
        kinds = sorted(d["histogram"])
        width = 0.8 / max(len(kinds), 1)
        for k, kind in enumerate(kinds):
            counts = d["histogram"][kind]
            xs = [i - 0.4 + width * (k + 0.5) for i in range(n)]
            mx = (d.get("max_ulp_err_by_kind") or {}).get(kind)
            ax.bar(xs, counts, width=width, color=_KIND_COLORS.get(kind),
                   label=f"{kind}: {sum(counts):,} elements"
                         + (f", max {mx:.3g} ulp" if mx is not None else "")
                         + (" (bound adds ~N ulp: sums in the dtype)" if kind == "ag_rs" else ""))
        ax.set_yscale("symlog", linthresh=1)
        ax.set_xticks(range(n))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_xlabel(f"|error| in ulps of {dt} (vs the float64 oracle)")
        ax.set_ylabel("elements")
        if rounding is not None and rounding in edges:
            x = edges.index(rounding) - 0.5
            ax.axvline(x, color="crimson", linestyle="--", linewidth=1.5,
                       label=f"the bound's rounding part: {rounding:g} ulp (E comes on top)")
        ax.set_title(f"{dt}: output error in ulps over {d['checks']} merge checks", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        redges = [float(e) for e in d.get("ratio_bin_edges") or ()]
        ratios = d.get("ratio_histogram") or []
        if redges and ratios:
            rlabels = [_bin_label(redges[i], redges[i + 1]) for i in range(len(redges) - 1)]
            ax2.bar(range(len(ratios)), ratios, color="tab:green",
                    label=f"{sum(ratios):,} elements; worst "
                          f"{fmt_ratio(d.get('worst_output_ratio'))}")
            ax2.axvline(len(ratios) - 1.5, color="crimson", linestyle="--", linewidth=1.5,
                        label="pass: error <= bound")
            ax2.set_xticks(range(len(ratios)))
            ax2.set_xticklabels(rlabels, rotation=60, ha="right", fontsize=7)
            ax2.set_yscale("symlog", linthresh=1)
            ax2.legend(fontsize=8)
            ax2.grid(axis="y", alpha=0.3)
        ax2.set_xlabel("|error| / bound (tolerances.yaml, the whole bound)")
        ax2.set_title("error over its bound: the criterion", fontsize=10)
        fig.text(0.01, 0.01, "\n".join(textwrap.wrap(ULP_LINE_NOTE.format(dt=dt), 190)),
                 fontsize=7, va="bottom")
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        p = out_dir / f"ulp_{dt}.png"
        fig.savefig(p)
        plt.close(fig)
        paths[dt] = str(p)
    return paths


_KIND_COLORS = {"a2a": "tab:blue", "ag_rs": "tab:orange"}


def _bin_label(lo, hi) -> str:
    lo, hi = float(lo), float(hi)
    return f"[{lo:g},{'inf' if math.isinf(hi) else f'{hi:g}'})"


# --------------------------------------------------------------------------- files

def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(as_plain(report), indent=1) + "\n")


def write_markdown(report: dict, path: Path) -> None:
    m = report["machine"]
    o = report["options"]
    L = [f"# dcp_a2a validation — {verdict_word(report).upper()}", ""]
    L.append(f"{report['started_at']} · wall {fmt_time(report['wall_s'])} · exit status "
             f"{report['exit_status']}" + (" · quick subset" if o["quick"] else ""))
    impl = report["implementation"]
    L += ["", f"**Implementation under test:** `{impl['spec']}` — module `{impl['module']}`, "
              f"file `{impl['file'] or '-'}`"
              + (f"; lacks {', '.join(impl['missing'])} (tests needing them skip)"
                 if impl["missing"] else "")
              + ". Every count, error and plot below measures this code"
              + ("" if impl["spec"] == "dcp_a2a" else
                 "; the project's tests of its own kernels are left out") + "."]
    L += ["", "## Machine", "", "| | |", "|---|---|"]
    gpus = (", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in m["gpus"])
            or "none (CPU only)")
    for k, v in [("host", f"{m['hostname']} · {m['platform']} · {m['cpu_count']} CPUs"),
                 ("python", m["python"]), ("torch", f"{m['torch']} (CUDA {m['torch_cuda']})"),
                 ("triton", f"{m['triton']} · {m['triton_mode']} (TRITON_INTERPRET="
                            f"{m['TRITON_INTERPRET']})"),
                 ("GPUs", gpus),
                 ("eval model", m["eval_model"] or "not found"),
                 ("GSM8K", f"{m['gsm8k_dir']} ({'present' if m['gsm8k_present'] else 'absent'})"),
                 ("commit", m["git_commit"] or "-"),
                 ("command", "`" + " ".join(report["command"]) + "`")]:
        L.append(f"| {k} | {v} |")
    L += ["", "## Tiers", "",
          "| tier | status | cases | passed | failed | skipped | xfailed | not run | left out "
          "(--quick) | other code | worst err/tol | headroom | time | worst case |",
          "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for t in report["tiers"]:
        wc = t.get("worst_case") or {}
        wcs = (f"`{wc['nodeid']}` ({wc['dtype']}, {wc['kind']}, N={wc['world_size']})"
               if wc else "")
        status = t["status"] + (f": {t['reason']}" if t.get("reason") else "")
        L.append(f"| {t['name']} | {status} | {t['cases']} | {t['passed'] + t['xpassed']} | "
                 f"{t['failed']} | {t['skipped']} | {t['xfailed']} | "
                 f"{t['not_run'] + t.get('unfinished', 0)} | "
                 f"{t['left_out']} | {t.get('other_code', 0)} | {fmt_ratio(t['worst_ratio'])} | "
                 f"{fmt_headroom(t['headroom'])} | {fmt_time(t['time_s'])} | {wcs} |")
    tot = report["totals"]
    L.append(f"| **total** | {verdict_word(report)} | {tot['cases']} | "
             f"{tot['passed'] + tot['xpassed']} | {tot['failed'] + tot['error']} "
             f"| {tot['skipped']} | {tot['xfailed']} | | | | {fmt_ratio(report.get('worst_ratio'))} | "
             f"{fmt_headroom(report.get('headroom'))} | {fmt_time(report['wall_s'])} (wall) | |")
    L += ["", "A test in several tiers (kernel + conformance) runs once and counts in each row; "
          "the total counts tests. Tier time is the sum of its tests' durations; the total is "
          "wall-clock. err/tol is the worst per-element error over the tolerance of "
          "tolerances.yaml across the tier's merge checks; headroom = tol/err. For 16-bit "
          "outputs the bound is half an ulp of the dtype plus the fp32 evaluation allowance, so "
          "a correctly rounded result sits at err/tol ~ 1 (headroom ~1.00x): the best possible, "
          "not a near miss. xfailed: strict expected failures (the broken designs the tests "
          "must catch); their reasons are listed below."]
    if report.get("evals"):
        L += ["", "## End-to-end evals", "", "| job | status | time | result | log |",
              "|---|---|--:|---|---|"]
        for e in report["evals"]:
            res = f"`{e['result_file']}`" if e.get("result_file") else "-"
            log = f"`{e['log']}`" if e.get("log") else "-"
            st = e["status"] + (f": {e['reason']}" if e.get("reason") else "")
            L.append(f"| {e['name']} | {st} | {fmt_time(e['wall_s'])} | {res} | {log} |")
        for e in report["evals"]:
            md = Path(e["result_file"]).parent / "results.md" if e.get("result_file") else None
            if md and md.is_file():
                L += ["", f"### {e['name']} (from {md})", "", md.read_text().strip()]
    if report["dtypes"]:
        from . import tolerances as tol

        L += ["", "## Errors per dtype (output, in ulps of the dtype)", "",
              "| dtype | checks | elements | max ulp (A2A) | max ulp (ag_rs) | worst err/tol | "
              "headroom | upstream #41160 check would pass | plot |",
              "|---|--:|--:|--:|--:|--:|--:|--:|---|"]
        ups = {}
        for dt, d in report["dtypes"].items():
            png = report["paths"]["png"].get(dt)
            by = d.get("max_ulp_err_by_kind") or {}
            ulps = " | ".join(f"{by[k]:.3g}" if k in by else "-" for k in ("a2a", "ag_rs"))
            try:
                ups[dt] = tol.load()["upstream_vllm_pr41160"][dt]
            except KeyError:
                ups[dt] = None
            L.append(f"| {dt} | {d['checks']} | {d['elements']:,} | {ulps} | "
                     f"{fmt_ratio(d['worst_ratio'])} | {fmt_headroom(d['headroom'])} | "
                     f"{d['upstream_would_pass']}/{d['checks']} | "
                     + (f"![{dt}]({Path(png).name})" if png else "-") + " |")
        L += ["", ULP_LINE_NOTE.format(dt="the dtype"), "",
              "The upstream column: how many of the merge checks would also pass the comparison "
              "of the vLLM change this project grew from (PR #41160: torch.testing-style "
              "|actual - expected| <= tol * (1 + |expected|) on every finite element, with tol "
              + "; ".join(f"{dt} output {u['output']:g}, LSE {u['lse']:g}"
                          for dt, u in ups.items() if u)
              + "). Reported beside ours, never used to pass or fail. The checks it would fail:"]
        failing = [(dt, f) for dt, d in report["dtypes"].items()
                   for f in d.get("upstream_failing") or ()]
        L += [f"- {dt}: `{f['nodeid']}` ({', '.join(f['quantities'])}; {f['kind']}, "
              f"N={f['world_size']})" for dt, f in failing[:30]] or ["- none"]
        if len(failing) > 30:
            L.append(f"- ... {len(failing) - 30} more (validation.json: dtypes.*.upstream_failing)")
    if report.get("contract"):
        L += ["", "## The contract, clause by clause", "", "```"] + contract_lines(report) + [
            "```", "",
            "judged = passed + failed. n/a: not applicable, the implementation does not expose "
            "the surface the clause needs (never a failure, never a pass). outside: cases "
            "outside the envelope the implementation declares (what it refuses loudly); "
            "the envelope clause checks once that it does refuse there."]
    fails = report.get("failures", [])
    by_clause = failures_by_clause(fails)
    if by_clause:
        from .plugin import CLAUSES

        L += ["", "## Failures by contract clause", "",
              "| clause | failed tests | what the clause says | first failure |",
              "|---|--:|---|---|"]
        for c, fs in by_clause.items():
            L.append(f"| {c} | {len(fs)} | {CLAUSES.get(c, '-')} | `{fs[0]['nodeid']}` |")
    if fails:
        L += ["", f"## Failures ({len(fails)})", ""]
        L.append("Worst first: defects, then weaker precision, limitations, conventions.")
        L.append("")
        for f in fails[:50]:
            sev = f.get("severity") or "defect"
            L += [f"### {sev} ({f.get('why') or f['outcome']}): `{f['nodeid']}`", "",
                  f"{(f.get('message') or '').splitlines()[0] if f.get('message') else ''}",
                  "", "```",
                  (f.get("text") or "").strip()[-3000:], "```", ""]
            if (f.get("repro") or {}).get("script"):
                L += ["Reproducer:", "", "```python", f["repro"]["script"].rstrip(), "```", ""]
    for key, title in (("xfail_reasons", "Expected failures (xfail, strict)"),
                       ("skip_reasons", "Skip reasons")):
        reasons: dict[str, int] = {}
        for t in report["tiers"]:  # a test in several tiers is listed once
            for r, c in (t.get(key) or {}).items():
                reasons[r] = max(reasons.get(r, 0), c)
        if reasons:
            L += ["", f"## {title}", "", "| tests | reason |", "|--:|---|"]
            for r, c in sorted(reasons.items(), key=lambda kv: -kv[1]):
                L.append(f"| {c} | {r.replace('|', '/')} |")
    top = report.get("slowest_tests") or []
    if top:
        share = sum(t["duration_s"] for t in top) / max(report["totals"].get("test_time_s") or 0,
                                                        1e-9)
        L += ["", f"## Slowest {len(top)} tests", "",
              f"{share:.0%} of the summed test time (setup + call + teardown; on a GPU the "
              "first test to launch a kernel specialisation also pays its compile).", "",
              "| s | outcome | tiers | test |", "|--:|---|---|---|"]
        L += [f"| {t['duration_s']:.2f} | {t['outcome']} | {', '.join(t['tiers'])} | "
              f"`{t['nodeid']}` |" for t in top]
    L += ["", "## pytest sessions", ""]
    for r in report.get("runs", []):
        L.append(f"- `{r['name']}`: tiers {', '.join(r['tiers'])}; exit {r['exit_status']}; "
                 f"{fmt_time(r['wall_s'])}; log `{r['log']}`"
                 + (f"; **{r['problem']}**" if r.get("problem") else ""))
    path.write_text("\n".join(L) + "\n")
