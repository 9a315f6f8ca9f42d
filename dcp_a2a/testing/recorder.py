"""pytest plugin behind ``dcp-a2a validate``: tier selection and per-test result records.

Loaded with ``-p dcp_a2a.testing.recorder``; inert unless ``--dcp-report PREFIX`` is given.

Tiers. A test belongs to every tier whose marker it carries (``unit``, ``kernel``, ``multiproc``,
``conformance``, ``numerics``, ``gpu``, ``multigpu``, ``e2e``) and, if it carries none, to the tier
named by its directory under ``tests/`` (``tests/unit/...`` -> ``unit``). A test that is in
several tiers (kernel + conformance) runs once and is counted in each of them.

Selection (``pytest_collection_modifyitems``, identical on every xdist worker):

* ``--dcp-tiers a,b``  keep tests in at least one of these tiers;
* ``--dcp-exclude m,n`` drop tests carrying any of these markers/tiers (tiers that cannot run
  here, e.g. ``gpu`` on a CPU machine, or ``multigpu`` when it runs in its own session);
* ``--dcp-quick``      drop ``slow`` tests and keep one case (the first parametrisation) of
  every test function of the project's own tiers, so the quick subset touches every test but
  stays small; conformance tests keep every case (each is a case of the contract, a few ms
  each: with the first alone, ``--quick`` passed an implementation that ignores the LSE base,
  skips the exchange or packs over its own input);
* ``--dcp-impl-only``  keep only tests that exercise the implementation under test (they take
  the ``impl`` fixture and not ``project_only``): under a foreign ``--impl`` the project's own
  tests of its kernels would measure dcp_a2a, not the code the report names.

Records. ``PREFIX.collection.json`` (written once, by the controller or xdist worker gw0) lists
the selected node ids with their tiers and every dropped test with the reason.
``PREFIX.results.jsonl`` (written by the controller as tests finish, one JSON object a line) holds
per test: outcome (passed / failed / error / skipped / xfailed / xpassed), tiers, markers,
its clause, a failure's severity and reproducer (the plugin's ``severity`` and ``repro`` user
properties),
duration, ``t`` (seconds from the session's start when its record was written; the start line
carries when it started), ``worker`` (the xdist worker that ran it), skip reason or a short
failure text, and every ``merge_report`` user property (the
``merge_check`` fixture's :meth:`dcp_a2a.testing.compare.MergeReport.as_dict`). A
``{"event": "start", "nodeid": ...}`` line precedes each test's record, so a reader can name the
test that was running when the process died (a segfault, ``os._exit``, an illegal CUDA access in
the code under test: no report, no session record). The last line is a ``{"event": "session"}``
record with pytest's exit status.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from .tiers import OTHER_CODE, TIERS


_MAX_TEXT = 6000
# pytest's own marks say nothing about what a test covers
_PYTEST_MARKS = {"parametrize", "usefixtures", "filterwarnings", "skip", "skipif", "xfail",
                 "timeout", "xdist_group", "flaky", "clause"}


def pytest_addoption(parser):
    g = parser.getgroup("dcp-a2a validate")
    g.addoption("--dcp-report", default=None, metavar="PREFIX",
                help="write PREFIX.collection.json and PREFIX.results.jsonl (dcp-a2a validate)")
    g.addoption("--dcp-tiers", default=None, metavar="T1,T2",
                help="run only tests in these tiers (markers, or tests/<tier>/ when unmarked)")
    g.addoption("--dcp-exclude", default=None, metavar="M1,M2",
                help="drop tests carrying any of these markers/tiers")
    g.addoption("--dcp-quick", action="store_true", default=False,
                help="drop slow tests; keep the first parametrisation of each test function")
    g.addoption("--dcp-impl-only", action="store_true", default=False,
                help="keep only tests of the implementation under test (the impl fixture)")
    g.addoption("--dcp-deselect", default=None, metavar="FILE",
                help="leave out the tests whose node ids FILE lists, one a line (a session "
                     "that goes on where one that died stopped)")


def _csv(v):
    return [s.strip() for s in v.split(",") if s.strip()] if v else []


def item_tiers(item) -> list[str]:
    marks = {m.name for m in item.iter_markers()}
    if "selfcheck" in marks:  # its own job (python -m dcp_a2a.testing.selfcheck), never a tier's test
        return []
    tiers = [t for t in TIERS if t in marks]
    if not tiers:
        try:
            rel = Path(str(item.path)).resolve().relative_to(Path(str(item.config.rootpath)).resolve())
            parts = rel.parts
        except (ValueError, AttributeError):
            parts = ()
        if len(parts) >= 2 and parts[0] == "tests" and parts[1] in TIERS:
            tiers = [parts[1]]
    return tiers


def tests_impl(item) -> bool:
    """Whether a test exercises the implementation under test (``--impl``)."""
    names = getattr(item, "fixturenames", ())
    return "impl" in names and "project_only" not in names


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _writes_collection(config) -> bool:
    return not _is_worker(config) or config.workerinput.get("workerid") == "gw0"


def _atomic_write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, default=_json_default))
    os.replace(tmp, path)


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    return repr(o)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    prefix = config.getoption("--dcp-report")
    tiers_opt = _csv(config.getoption("--dcp-tiers"))
    exclude = set(_csv(config.getoption("--dcp-exclude")))
    quick = config.getoption("--dcp-quick")
    impl_only = config.getoption("--dcp-impl-only")
    done_file = config.getoption("--dcp-deselect")
    done = set(Path(done_file).read_text().split()) if done_file else set()
    if prefix is None and not tiers_opt and not exclude and not quick and not impl_only \
            and not done:
        return
    keep, dropped, seen_functions = [], [], set()
    for item in items:
        tiers = item_tiers(item)
        marks = sorted({m.name for m in item.iter_markers()} - _PYTEST_MARKS)
        reason = None
        if item.nodeid in done:
            reason = "ran in an earlier session"
        elif tiers_opt and not set(tiers) & set(tiers_opt):
            reason = "tier not selected" if tiers else "in no tier"
        elif exclude & (set(tiers) | set(marks)):
            reason = "excluded: " + ",".join(sorted(exclude & (set(tiers) | set(marks))))
        elif impl_only and not tests_impl(item):
            reason = OTHER_CODE
        elif quick:
            if "slow" in marks:
                reason = "quick: slow"
            elif "conformance" not in tiers:  # project tests: one case each; contract cases all
                fn = getattr(item, "originalname", None) or item.name
                key = (item.nodeid.split("::")[0], getattr(item.cls, "__name__", ""), fn)
                if key in seen_functions:
                    reason = "quick: further parametrisation"
                seen_functions.add(key)
        if reason is None:
            item.user_properties.append(("dcp_tiers", tiers))
            item.user_properties.append(("dcp_markers", marks))
            clause = item.get_closest_marker("clause")
            if clause is not None and clause.args:
                item.user_properties.append(("dcp_clause", str(clause.args[0])))
            item.user_properties.append(("dcp_uses_impl", tests_impl(item)))
            keep.append(item)
        else:
            dropped.append({"nodeid": item.nodeid, "tiers": tiers, "markers": marks,
                            "reason": reason})
    if dropped:
        drop_ids = {d["nodeid"] for d in dropped}
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in drop_ids])
        items[:] = keep
    if prefix and _writes_collection(config):
        _atomic_write_json(Path(prefix + ".collection.json"), {
            "selected": [{"nodeid": i.nodeid, "tiers": dict(i.user_properties).get("dcp_tiers", []),
                          "markers": dict(i.user_properties).get("dcp_markers", []),
                          "clause": dict(i.user_properties).get("dcp_clause")}
                         for i in keep],
            "dropped": dropped,
        })


class _Recorder:
    """Controller-side: fold setup/call/teardown reports into one record per test."""

    def __init__(self, prefix: str):
        self.path = Path(prefix + ".results.jsonl")
        self.path.write_text("")
        self.fh = open(self.path, "a", buffering=1)
        self.pending: dict[str, dict] = {}
        self.collect_errors = 0
        self.t0 = time.time()

    def _now(self) -> float:
        return round(time.time() - self.t0, 3)

    def _emit(self, rec: dict) -> None:
        if rec["event"] == "test":  # when it ended and where: the session's timeline
            rec.setdefault("t", self._now())
        self.fh.write(json.dumps(rec, default=_json_default) + "\n")

    @pytest.hookimpl
    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors += 1
            self._emit({"event": "test", "nodeid": report.nodeid or "<collection>",
                        "outcome": "error", "phase": "collect", "tiers": [], "markers": [],
                        "duration": 0.0, "text": _text(report)[-_MAX_TEXT:],
                        "message": _crash_message(report), "merge_reports": []})

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid, location):
        self._emit({"event": "start", "nodeid": nodeid, "t": self._now()})

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        rec = self.pending.setdefault(report.nodeid, {
            "event": "test", "nodeid": report.nodeid, "outcome": None, "phase": None,
            "tiers": [], "markers": [],
            "duration": 0.0, "text": "", "message": "", "merge_reports": []})
        node = getattr(report, "node", None)  # xdist: the worker that ran it
        if node is not None and "worker" not in rec:
            rec["worker"] = getattr(getattr(node, "gateway", None), "id", None)
        rec["duration"] += float(getattr(report, "duration", 0.0) or 0.0)
        props = list(getattr(report, "user_properties", []) or [])
        for k, v in props:
            if k == "dcp_tiers":
                rec["tiers"] = list(v)
            elif k == "dcp_markers":
                rec["markers"] = list(v)
            elif k == "dcp_clause":
                rec["clause"] = v
            elif k == "dcp_uses_impl":  # a test of the implementation, not of the harness
                rec["uses_impl"] = bool(v)
            elif k == "severity":  # the plugin's verdict on a failure (.verdicts)
                rec["severity"] = v
            elif k == "repro":     # a failure as a few lines of Python (.repro)
                rec["repro"] = v
        merges = [v for k, v in props if k == "merge_report"]
        if merges:
            rec["merge_reports"] = merges  # cumulative on the item: the last phase has all
        wasxfail = hasattr(report, "wasxfail")
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.passed:
                rec["outcome"] = "xpassed" if wasxfail else "passed"
            elif report.skipped:
                rec["outcome"] = "xfailed" if wasxfail else "skipped"
                rec["text"] = _skip_reason(report) if not wasxfail else str(report.wasxfail)
            else:
                rec["outcome"] = "failed" if report.when == "call" else "error"
                rec["text"] = _text(report)[-_MAX_TEXT:]
                rec["message"] = _crash_message(report)
            rec["phase"] = report.when
        elif report.when not in ("setup", "teardown"):  # xdist's crashed-worker report ("???")
            rec["outcome"] = "failed"
            rec["phase"] = "crash"
            rec["text"] = _text(report)[-_MAX_TEXT:]
            rec["message"] = _crash_message(report)
            rec["severity"] = {"severity": "defect", "why": "memory unsafety (the worker "
                                                            "process died)"}
            self._emit(self.pending.pop(report.nodeid))
            return
        if report.when == "teardown":
            if report.failed and rec["outcome"] in (None, "passed", "xpassed"):
                rec["outcome"], rec["phase"] = "error", "teardown"
                rec["text"] = _text(report)[-_MAX_TEXT:]
                rec["message"] = _crash_message(report)
            if rec["outcome"] is None:
                rec["outcome"] = "error"
            self._emit(self.pending.pop(report.nodeid))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        for rec in self.pending.values():
            if rec["outcome"] is None:
                rec["outcome"], rec["text"] = "error", "no result reported (interrupted?)"
            self._emit(rec)
        self.pending.clear()
        self._emit({"event": "session", "exitstatus": int(exitstatus),
                    "collect_errors": self.collect_errors,
                    "duration": time.time() - self.t0})
        self.fh.close()


def _text(report) -> str:
    try:
        return report.longreprtext or ""
    except Exception:  # pragma: no cover - exotic report objects
        return str(getattr(report, "longrepr", ""))


def _crash_message(report) -> str:
    """pytest's one-line summary of a failure (what ``-rf`` prints): ``Type: message``."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    msg = getattr(crash, "message", None)
    if not msg:
        lines = [ln for ln in _text(report).splitlines() if ln.strip()]
        msg = lines[-1] if lines else ""
    return msg.strip()[:_MAX_TEXT]


def _skip_reason(report) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        return str(lr[2]).removeprefix("Skipped: ")
    return _text(report)[-_MAX_TEXT:]


def pytest_configure(config):
    prefix = config.getoption("--dcp-report")
    if prefix and not _is_worker(config):
        config.pluginmanager.register(_Recorder(prefix), "dcp_a2a_recorder")
