"""What the accuracy job reports: each rank's merged slice checked against the float64 oracle
(``dcp_a2a.testing.compare.check_merge``, bounds from tolerances.yaml) in row chunks of bounded
memory, one row per (backend, dtype, shape, LSE base) merged over the ranks (the worst error,
the slowest rank's time, bitwise equality with packed on every rank), the table rank 0 prints
and the JSON it writes.

Per row: the dtype the LSE was handed over in and the rows of empty shards and padding (summed
over the ranks), max |err| and max error in ulps of the output dtype, worst error / tolerance,
the returned LSE's max |err| and error / tolerance, whether two_collective and symm_mem produced
outputs and LSEs bitwise identical to packed's, and the wall time of one ``lse_reduce`` call
(median over ``--iters`` after ``--warmup``, slowest rank). A case in which the implementation
under test raised is a failing row that names the exception.
"""

from __future__ import annotations

import json
import math
import os

import torch

CHECK_CHUNK_ELEMENTS = 1 << 24   # oracle work per chunk of rows (float64 temporaries)


# --------------------------------------------------------------------------- checking
def _nanmax(a: float, b: float) -> float:
    """max that ignores NaN (the LSE has no ulp error) but keeps +inf (a NaN result)."""
    if math.isnan(a):
        return b
    return a if math.isnan(b) else max(a, b)


def _merge_quantity(acc, q):
    if q is None:
        return acc
    d = {"elements": q.elements, "max_abs_err": q.max_abs_err,
         "max_ulp_err": q.max_ulp_err, "worst_ratio": q.worst_ratio, "failures": q.failures,
         "upstream_ok": q.upstream_ok}
    if acc is None:
        return d
    for k in ("max_abs_err", "max_ulp_err", "worst_ratio"):
        acc[k] = _nanmax(acc[k], d[k])
    acc["elements"] += d["elements"]
    acc["failures"] += d["failures"]
    acc["upstream_ok"] = acc["upstream_ok"] and d["upstream_ok"]
    return acc


def check_slice(out, lse, outs, lses, base_e, kind) -> dict:
    """``check_merge`` over row chunks (bounded float64 memory); merged per-quantity stats."""
    from .compare import check_merge

    n, b, hpr, d = outs.shape
    rows = max(1, CHECK_CHUNK_ELEMENTS // max(1, n * hpr * d))
    res = {"output": None, "lse": None}
    for r0 in range(0, max(b, 1), rows):
        sl = slice(r0, r0 + rows)
        rep = check_merge(out[sl], None if lse is None else lse[sl], outs[:, sl], lses[:, sl],
                          is_lse_base_on_e=base_e, kind=kind, keep_ulp_errors=False)
        res["output"] = _merge_quantity(res["output"], rep.output)
        res["lse"] = _merge_quantity(res["lse"], rep.lse)
    return res


def _bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _report(meta: dict, merged: list[dict], complete: bool) -> dict:
    judged = [m for m in merged if m["ok"] is not None]
    return {"meta": meta, "cases": merged, "complete": complete,
            "ok": complete and bool(judged) and all(m["ok"] for m in judged)}


def merge_rows(gathered: list[list[dict]]) -> list[dict]:
    """One case's rows of every rank -> one row per backend: the worst error over the ranks,
    the slowest rank's time, bitwise equality on every rank. A rank on which the implementation
    raised makes the row a failure naming it (``error``); one on which its adapter said the
    case cannot be expressed (``not_applicable``) leaves the row unjudged (``ok`` None)."""
    merged = []
    for i, row in enumerate(gathered[0]):
        per_rank = [g[i] for g in gathered]
        m = dict(row)
        errors = [f"rank {r}: {pr['error']}" for r, pr in enumerate(per_rank) if pr.get("error")]
        unsupported = [pr["not_applicable"] for pr in per_rank if pr.get("not_applicable")]
        if errors or unsupported:
            m.pop("error", None)
            m.pop("not_applicable", None)
            m.update(output=None, lse=None, seconds=math.nan)
            if errors:
                m.update(error="; ".join(errors), ok=False)
            else:
                m.update(not_applicable=unsupported[0], ok=None)
            merged.append(m)
            continue
        for q in ("output", "lse"):
            acc = None
            for pr in per_rank:
                if pr[q] is not None:
                    acc = _merge_quantity(acc, _Q(pr[q]))
            m[q] = acc
        m["seconds"] = max(pr["seconds"] for pr in per_rank)
        if "ratio_vs_a2a_bound" in row:
            m["ratio_vs_a2a_bound"] = max(pr["ratio_vs_a2a_bound"] for pr in per_rank)
        if "bitwise_eq_packed" in row:
            m["bitwise_eq_packed"] = all(pr["bitwise_eq_packed"] for pr in per_rank)
        m["ok"] = (m["output"]["failures"] == 0
                   and (m["lse"] is None or m["lse"]["failures"] == 0)
                   and m.get("bitwise_eq_packed", True))
        merged.append(m)
    return merged


class _Q:
    """A per-quantity dict seen through QuantityReport's attribute names."""

    def __init__(self, d):
        self.__dict__.update(d)


EXIT_FAILED, EXIT_NOTHING_CHECKED = 1, 5


def exit_status(report: dict | None) -> int:
    """0 every case within its bound (None: a rank that reports nothing, not rank 0), 1 a case
    failed, 5 no case could be judged (every one not applicable to the implementation)."""
    if report is None or report["ok"]:
        return 0
    if any(c["ok"] is False for c in report["cases"]) or not report.get("complete", True):
        return EXIT_FAILED
    return EXIT_NOTHING_CHECKED


def format_table(report: dict) -> str:
    meta = report["meta"]
    head = (f"dcp_a2a accuracy: N={meta['world_size']} {meta['dist_backend']} on "
            f"{meta['device']}{' (Triton interpreter)' if meta['triton_interpreter'] else ''}"
            f", impl {meta['implementation']}")
    cols = (f"{'backend':<14} {'dtype':<8} {'shape':<12} {'base':<4} {'lse in':<8} "
            f"{'empty':>5} {'max|err|':>9} "
            f"{'ulp':>7} {'err/tol':>7} {'lse err':>9} {'lse/tol':>7} {'bitwise':>7} "
            f"{'ms':>9}  status")
    lines = [head, cols, "-" * len(cols)]
    for c in report["cases"]:
        if c.get("error") or c.get("not_applicable"):
            what = (f"FAIL  the implementation raised: {c['error']}" if c.get("error") else
                    f"not applicable: {c['not_applicable']}")
            lines.append(f"{c['backend']:<14} {c['dtype']:<8} {c['shape']:<12} {c['base']:<4} "
                         f"{c.get('lse_dtype', '-'):<8} {c.get('empty_rows', '-'):>5}  {what}")
            continue
        o, s = c["output"], c["lse"] or {}
        bw = c.get("bitwise_eq_packed")
        extra = (f"  (vs A2A tol {c['ratio_vs_a2a_bound']:.3g})"
                 if "ratio_vs_a2a_bound" in c else "")
        lines.append(
            f"{c['backend']:<14} {c['dtype']:<8} {c['shape']:<12} {c['base']:<4} "
            f"{c.get('lse_dtype', '-'):<8} {c.get('empty_rows', '-'):>5} "
            f"{o['max_abs_err']:>9.2e} {o['max_ulp_err']:>7.3g} {o['worst_ratio']:>7.3f} "
            f"{s.get('max_abs_err', float('nan')):>9.2e} {s.get('worst_ratio', float('nan')):>7.3f} "
            f"{'-' if bw is None else ('yes' if bw else 'NO'):>7} {c['seconds'] * 1e3:>9.3f}  "
            f"{'ok' if c['ok'] else 'FAIL'}{extra}")
    for be, why in meta.get("backends_not_run", {}).items():
        lines.append(f"not run: {be} ({why})")
    if meta["skipped_shapes"]:
        lines.append(f"skipped (H not divisible by {meta['world_size']}): "
                     f"{', '.join(meta['skipped_shapes'])}")
    failed = sum(c["ok"] is False for c in report["cases"])
    unjudged = sum(c["ok"] is None for c in report["cases"])
    lines += ["", LEGEND, f"{len(report['cases'])} cases, {failed} failed"
              + (f", {unjudged} not applicable" if unjudged else "")]
    return "\n".join(lines)


LEGEND = ("columns: lse in = the dtype the ranks hand their LSE over in; empty = rows of empty "
          "KV shards and padding, summed over the ranks (masked through seq_lens/"
          "query_start_loc, NaN partials); max|err| and ulp = the largest output error "
          "(absolute, and in ulps of the output dtype); err/tol = the worst error over its "
          "bound (tolerances.yaml; a row passes at <= 1); lse err, lse/tol = the same for the "
          "returned LSE; bitwise = the row's output and LSE have the same bits as packed's "
          "(two_collective, symm_mem); ms = one lse_reduce call, median, slowest rank. ag_rs "
          "sums in the output dtype, so it is judged against its own, wider bound; "
          "'(vs A2A tol r)' says how far it lands against the A2A paths' bound.")


def write_report(report: dict, path) -> None:
    """Write the JSON report atomically (a reader never sees half a file); its directory is
    created if missing."""
    from .outpaths import make_parent

    path = make_parent(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, path)

