"""The tally of a validation run: per tier (statuses, counts, the worst error over the bound and
its headroom), per output dtype (ulp histograms, what the upstream tolerances would fail), the
totals and the slowest tests, from the recorder's per-test records.

Per-tier status: ``passed`` (something passed, nothing failed), ``failed`` (a failure or error),
``skipped`` (every test skipped itself), ``no tests`` (nothing collected), ``not run`` (the tier
cannot run here, or was not asked for: ``reason`` says which).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from .impl import DEFAULT_SPEC
from .sessions import UNFINISHED
from .tiers import OTHER_CODE, TierPlan


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

