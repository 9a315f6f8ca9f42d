"""The multi-process tier: real gloo process groups from the pool of ranks (the ``rank_pool``
fixture of dcp_a2a/testing/plugin.py, shared with the conformance suite's multi-process tests).

Every CPU pool of a test process forks its ranks from that process's one fork server, which has
imported torch, Triton and dcp_a2a; the torchrun launcher and the pool owner of the fault tests
are forks of it too (tests/multiproc/_procs.py), so the tier pays torch's import once per test
process. On a GPU machine the ranks are spawned and compute on the GPUs (compiled kernels).
"""

from __future__ import annotations


# --------------------------------------------------------------------------- ag_rs report
def pytest_terminal_summary(terminalreporter):
    """Print how far ag_rs lands from the float64 oracle next to the A2A paths (recorded by
    test_backends.py::test_backends_agree_and_match_oracle)."""
    rows = []
    for rep in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for key, val in getattr(rep, "user_properties", []):
            if key == "ag_rs_vs_a2a":
                rows.append(val)
    if not rows:
        return
    agg: dict = {}
    for r in rows:
        k = (r["dtype"], r["world_size"])
        a = agg.setdefault(k, {"cases": 0})
        for key, v in r.items():
            if key not in ("dtype", "world_size", "base"):
                a[key] = max(a.get(key, 0.0), v)
        a["cases"] += 1
    tr = terminalreporter
    tr.write_sep("-", "ag_rs vs A2A (packed) error against the float64 oracle, multiproc gloo")
    tr.write_line("err/tol: worst error over the bound of tolerances.yaml (A2A bound for A2A; "
                  "ag_rs against its own bound and against the A2A bound)")
    tr.write_line(f"{'dtype':>9} {'N':>2} {'cases':>5} | {'A2A ulp':>8} {'err/tol':>8} "
                  f"{'max|err|':>9} | {'ag_rs ulp':>9} {'err/tol':>8} {'vs A2A tol':>10} "
                  f"{'max|err|':>9}")
    for (dt, n), a in sorted(agg.items()):
        tr.write_line(
            f"{dt:>9} {n:>2} {a['cases']:>5} | {a['a2a_max_ulp']:>8.3g} "
            f"{a['a2a_worst_ratio']:>8.3g} {a['a2a_max_abs']:>9.2e} | "
            f"{a['ag_rs_max_ulp']:>9.3g} {a['ag_rs_worst_ratio']:>8.3g} "
            f"{a['ag_rs_ratio_vs_a2a_bound']:>10.3g} {a['ag_rs_max_abs']:>9.2e}")
