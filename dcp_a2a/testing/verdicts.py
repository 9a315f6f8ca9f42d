"""How bad a failure is: every failing conformance test gets a severity, so that a verdict on an
engine leads with what matters.

========== ==============================================================================
severity   what it means
========== ==============================================================================
defect     memory unsafety (a crash, an illegal access), a hang, wrong numbers inside the
           envelope, the caller's tensors changed, garbage accepted (in that order)
precision  right numbers, less precisely than the derived bound: the measured factor over
           the bound and the formulation whose own bound the errors stay within
limitation valid input inside the declared envelope refused loudly (an exception): the
           envelope is narrower than the adapter says
convention a difference of convention: the error type or wording of a refusal, what a
           NaN/+inf LSE or a group of one gives
========== ==============================================================================

A test raises :class:`Convention` or :class:`Precision` (both AssertionErrors) where its failure is
of that kind; any other assertion of the suite is a defect; an exception the implementation raised
(its own ``assert`` included) from a call the test expected to succeed is a limitation (the
implementation's calls are tagged by ``dcp_a2a.testing.impl``), except a lost GPU context, which
is memory unsafety.
"""

from __future__ import annotations

SEVERITIES = ("defect", "precision", "limitation", "convention")
ORDER = {s: i for i, s in enumerate(SEVERITIES)}
GARBAGE = "bad input accepted"  # how a refusal test says nothing refused (conformance._refusals)
# within the defects: what valid input does first (memory corrupted, a hang, wrong numbers),
# then what bad input does (memory corrupted, a hang, then bad input let through: an engine's
# private function that trusts its caller)
DEFECT_ORDER = ("memory unsafety", "hang", "wrong result", "defect", "garbage accepted")
BAD_INPUT = "bad input"  # the contract clause of the refusal tests (plugin.CLAUSES)


def rank(severity: str, why: str, clause: str | None = None) -> tuple:
    """Sort key of a failure, worst first; ``clause``: the contract clause of its test."""
    if severity != "defect":
        return ORDER[severity], 0
    sub = next((i for i, w in enumerate(DEFECT_ORDER) if why.startswith(w)), len(DEFECT_ORDER))
    from_bad_input = clause == BAD_INPUT or why.startswith("garbage accepted")
    return ORDER[severity], from_bad_input, sub
IMPL_RAISED = "_dcp_a2a_raised_by_implementation"

# a CUDA error that poisons the context: memory unsafety in the code that ran before it (a
# device-side assert is an index out of bounds that a kernel caught: the context is lost too)
_MEMORY_UNSAFE = ("illegal memory access", "misaligned address", "unspecified launch failure",
                  "illegal instruction", "out of bounds", "device-side assert")
# ...but not torch's own bounds check on the host (an IndexError "index 3 is out of bounds for
# dimension 0 with size 0"): the index was checked before any memory was read, a loud refusal
_BOUNDS_CHECKED = "out of bounds for dimension"


class Defect(AssertionError):
    """A defect inside a test whose other checks are conventions (``pytest.mark.convention``):
    the caller's tensors changed, a NaN let in. Never downgraded."""

    severity = "defect"


class Convention(AssertionError):
    """A difference of convention, not of results: the error type or wording of a refusal, a
    NaN/+inf LSE's meaning, what a group of one returns."""

    severity = "convention"


class Precision(AssertionError):
    """The right numbers, less precisely than the derived bound allows (the message gives the
    factor over the bound and the formulation within whose bound the errors stay)."""

    severity = "precision"


def memory_unsafe(text: str) -> bool:
    low = text.lower().replace(_BOUNDS_CHECKED, "")
    return any(s in low for s in _MEMORY_UNSAFE) or "segmentation fault" in low \
        or "signal 11" in low or "sigsegv" in low


def severity_of(exc: BaseException) -> tuple[str, str]:
    """(severity, why) of the exception a failing test raised."""
    if isinstance(exc, Defect):
        return "defect", "defect"
    if isinstance(exc, (Convention, Precision)):
        return exc.severity, type(exc).__name__.lower()
    text = f"{type(exc).__name__}: {exc}"
    if memory_unsafe(text):
        return "defect", "memory unsafety"
    if getattr(exc, IMPL_RAISED, False):  # the engine's own assert counts as a refusal too
        return "limitation", f"valid input refused ({type(exc).__name__})"
    pool_tracebacks = getattr(exc, "tracebacks", None)
    if isinstance(pool_tracebacks, dict) and pool_tracebacks:
        return severity_of_tracebacks(list(pool_tracebacks.values()))
    if isinstance(exc, AssertionError):
        if str(exc).startswith(GARBAGE):
            return "defect", "garbage accepted"
        return "defect", "wrong result"
    return "defect", f"unexpected {type(exc).__name__}"


def severity_of_tracebacks(texts: list[str]) -> tuple[str, str]:
    """The severity of the worst of several ranks' formatted tracebacks (a pool of ranks)."""
    found = []
    for t in texts:
        last = [ln for ln in t.strip().splitlines() if ln.strip()][-1:] or [""]
        line = last[0]
        if memory_unsafe(t):
            found.append(("defect", "memory unsafety"))
        elif f"{Convention.__module__}.Convention" in line or line.startswith("Convention"):
            found.append(("convention", "convention"))
        elif f"{Precision.__module__}.Precision" in line or line.startswith("Precision"):
            found.append(("precision", "precision"))
        elif "AssertionError" in line and not _raised_outside_the_suite(t):
            found.append(("defect", "wrong result"))
        elif _raised_outside_the_suite(t):  # the implementation's own code raised
            found.append(("limitation", f"valid input refused "
                                        f"({line.split(':', 1)[0].strip() or 'error'})"))
        else:
            found.append(("defect", f"unexpected {line.split(':', 1)[0].strip() or 'error'}"))
    return min(found, key=lambda f: ORDER[f[0]]) if found else ("defect", "rank failure")


def _raised_outside_the_suite(traceback_text: str) -> bool:
    """Whether a formatted traceback's innermost frame lies outside the suite's own code
    (dcp_a2a/testing, pytest, torch.multiprocessing): the implementation under test raised."""
    files = [ln.strip() for ln in traceback_text.splitlines() if ln.strip().startswith('File "')]
    if not files:
        return False
    last = files[-1].replace("\\", "/")
    return not any(part in last for part in ("/dcp_a2a/testing/", "/_pytest/", "/pytest/",
                                             "/multiprocessing/"))


def severity_of_text(text: str) -> tuple[str, str]:
    """The severity of a failure known only as text (a crashed or hung run's record)."""
    if memory_unsafe(text) or "process died" in text or "crashed" in text:
        return "defect", "memory unsafety"
    if "hang" in text or "no test reported" in text or "Timeout" in text:
        return "defect", "hang"
    return "defect", "failure"


def record_severity(rec: dict) -> tuple[str, str]:
    """(severity, why) of a failed record of the recorder (the plugin's, else read off its
    text: a crashed or hung test has no verdict of the plugin)."""
    sev = rec.get("severity")
    if isinstance(sev, dict) and sev.get("severity") in ORDER:
        return sev["severity"], sev.get("why", "")
    return severity_of_text(" ".join(str(rec.get(k, "")) for k in ("message", "text")))


def by_severity(failures: list[dict]) -> list[dict]:
    """Failed records, worst first (defects, precision, limitations, conventions), each with
    its ``severity`` and ``why`` filled in; the recorder's order within a severity."""
    out = []
    for f in failures:
        sev, why = record_severity(f)
        out.append(f | {"severity": sev, "why": why})
    return sorted(out, key=lambda f: rank(f["severity"], f["why"], f.get("clause")))


def clause_table(records: list[dict], clauses) -> list[dict]:
    """How much of each clause was judged, from the recorder's records of conformance tests:
    per clause ``passed``, ``failed`` (per severity), ``not_applicable`` (with the surfaces
    missing), ``outside`` (outside the envelope, with the limits), ``skipped`` (any other
    reason) and ``judged`` (passed + failed). Clauses no test ran are listed with zeros."""
    from .surfaces import ENVELOPE_LIMIT, NOT_APPLICABLE, OUTSIDE

    def empty(c):
        return {"clause": c, "passed": 0, "failed": {s: 0 for s in SEVERITIES},
                "not_applicable": 0, "not_applicable_why": [], "outside": 0, "outside_why": [],
                "limits": [], "skipped": 0, "judged": 0}

    rows = {c: empty(c) for c in clauses}
    for rec in records:
        c = rec.get("clause")
        if not c or rec.get("uses_impl") is False:
            continue
        row = rows.setdefault(c, empty(c))
        outcome = rec.get("outcome")
        text = str(rec.get("text") or "")
        if outcome in ("passed", "xpassed", "xfailed"):
            row["passed"] += 1
        elif outcome in ("failed", "error"):
            row["failed"][record_severity(rec)[0]] += 1
        elif outcome == "skipped" and text.startswith(NOT_APPLICABLE):
            row["not_applicable"] += 1
            why = text[len(NOT_APPLICABLE):].split(" (implementation")[0]
            if why not in row["not_applicable_why"]:
                row["not_applicable_why"].append(why)
        elif outcome == "skipped" and text.startswith(OUTSIDE):
            row["outside"] += 1
            why = text[len(OUTSIDE):]
            if why not in row["outside_why"]:
                row["outside_why"].append(why)
        elif outcome == "skipped" and text.startswith(ENVELOPE_LIMIT):
            row["limits"].append(text[len(ENVELOPE_LIMIT):])
        elif outcome == "skipped":
            row["skipped"] += 1
    for row in rows.values():
        row["judged"] = row["passed"] + sum(row["failed"].values())
    return list(rows.values())


def clause_status(row: dict) -> str:
    """One word for a clause: "failed", "passed", "not applicable" (nothing judged, every
    test not applicable), "outside envelope", "skipped" or "not run"."""
    if sum(row["failed"].values()):
        return "failed"
    if row["passed"]:
        return "passed"
    if row["not_applicable"]:
        return "not applicable"
    if row["outside"]:
        return "outside envelope"
    if row.get("limits"):
        return "limits reported"
    if row["skipped"]:
        return "skipped"
    return "not run"
