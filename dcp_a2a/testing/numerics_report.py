"""Numerics report: headroom against the derived bound, error distribution and rounding bias.

    python -m dcp_a2a.testing.numerics_report --out DIR [--impl SPEC] [--seed S]

Runs the implementation under test (default: this package) through the contract's in-process
exchange (every rank's ``pack_send``, the all-to-all as a transpose, ``unpack_combine``) on
random decode partials, and writes ``DIR/numerics.json`` and ``DIR/numerics.md``:

* per dtype and quantity (output / LSE, base e and base 2): elements, max |err|, max error in
  ulps, worst err/bound (``ratio``; headroom = 1/ratio), for outputs the share of the fp32
  evaluation allowance E used (``eval_ratio``) and the fraction of elements not rounded to
  nearest (``misrounded``), the upstream atol = rtol and the worst err / upstream tolerance,
  ulp-error quantiles;
* per 16-bit dtype the rounding-bias statistics over >= 1e5 elements (mean error in ulps,
  sign-aligned mean, one-sample t-test p-values, ALPHA);
* the degraded merges of dcp_a2a.testing.degraded: at 16 bits weights rounded to T, truncating
  cast, LSE rounded to T; at fp32 (float32 partials, LSEs of 30-50) weights from an fp32-rounded
  global LSE, no max subtraction, an exp 8x less accurate than ex2.approx, next to the
  implementation on the same partials: worst err/bound and whether the upstream tolerance
  would have passed them.

Bounds come from tolerances.yaml through :func:`dcp_a2a.testing.compare.oracle_bounds` (the
function check_merge uses); see docs/numerics.md. Without CUDA the kernels run in Triton's CPU
interpreter (numpy: correctly rounded exp, division), which is more accurate than the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from . import tolerances as tol  # noqa: E402
from .impl import load_impl  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ALPHA = 1e-3                      # family-wise, two t-tests at ALPHA / 2 (as in the tests)
QUANTILES = (0.5, 0.9, 0.99, 0.999, 1.0)
HEADROOM_SHAPE = (4, 8, 64, 128)  # N, B, H, D; rank 0 merges 8 x 16 x 128 = 16384 elements
BIAS_SHAPE = (2, 8, 256, 128)     # rank 0 merges 8 x 128 x 128 = 131072 elements


def partials(shape, dtype, seed, spread):
    """outs[N, B, H, D] ~ N(0, 1) in ``dtype``; float32 LSEs: per-row offset N(5, 8^2) plus a
    per-rank N(0, spread^2) (the distribution of tests/_data.partials)."""
    n, b, h, d = shape
    g = torch.Generator().manual_seed(seed)
    outs = torch.randn(n, b, h, d, generator=g).to(dtype)
    base = torch.randn(1, b, h, generator=g) * 8.0 + 5.0
    lses = (base + torch.randn(n, b, h, generator=g) * spread).to(torch.float32)
    return outs, lses


def merge_rank0(impl, outs, lses, base_e, device):
    """Rank 0's merged (out, lse) through the contract, and the head slice it owns."""
    n, b, h, d = outs.shape
    p = impl.lse_pack_dim(outs.dtype)
    sends = []
    for r in range(n):
        send = torch.full((n, b, h // n, d + p), math.nan, dtype=outs.dtype, device=device)
        impl.pack_send(outs[r].to(device), lses[r].to(device), send, n, h // n, d, p)
        sends.append(send)
    recv = torch.stack([s[0] for s in sends]).contiguous()
    out, lse = impl.unpack_combine(recv, d, p, True, base_e)
    return out.cpu(), lse.cpu(), slice(0, h // n)


def _quantiles(x: torch.Tensor) -> dict:
    if x.numel() == 0:
        return {}
    v = x.to(torch.float64).flatten().numpy()
    return {f"p{q * 100:g}": float(np.quantile(v, q)) for q in QUANTILES}


def _finite_ratio(err, bound):
    r = torch.where(err == 0, torch.zeros_like(err), err / bound)
    return float(torch.nan_to_num(r, nan=math.inf).max()) if r.numel() else 0.0


def quantity_rows(dtype, out, lse, outs, lses, base_e, heads):
    from .compare import oracle_bounds

    o, s = outs[:, :, heads], lses[:, :, heads]
    n = outs.shape[0]
    orc = oracle_bounds(o, s, dtype, is_lse_base_on_e=base_e)  # the bound check_merge uses
    ref, ref_lse = orc.out, orc.lse
    up = tol.upstream(dtype)
    base = "e" if base_e else "2"

    err = (out.to(torch.float64) - ref).abs()
    bound, e_bound = orc.out_bound, orc.evaluation
    half = tol.load()["a2a"][tol.dtype_name(dtype)]["output"]["rounding_ulps"]
    excess = (err - half * tol.ulp(ref.abs() + e_bound, dtype)).clamp(min=0)
    ulps = err / tol.ulp(ref, dtype)
    rows = [{
        "dtype": tol.dtype_name(dtype), "quantity": "output", "base": base, "world_size": n,
        "elements": err.numel(), "max_abs_err": float(err.max()),
        "max_ulp_err": float(ulps.max()), "ratio": _finite_ratio(err, bound),
        "eval_ratio": _finite_ratio(excess, e_bound),
        "misrounded": float((out != ref.to(dtype)).double().mean()),
        "upstream_tol": up["output"],
        "upstream_ratio": _finite_ratio(err, up["output"] * (1 + ref.abs())),
        "ulp_quantiles": _quantiles(ulps),
    }]
    lerr = (lse.to(torch.float64) - ref_lse).abs()
    lbound = orc.lse_bound
    rows.append({
        "dtype": tol.dtype_name(dtype), "quantity": "lse", "base": base, "world_size": n,
        "elements": lerr.numel(), "max_abs_err": float(lerr.max()),
        "max_ulp_err": float((lerr / tol.ulp(ref_lse, torch.float32)).max()),
        "ratio": _finite_ratio(lerr, lbound), "eval_ratio": None, "misrounded": None,
        "upstream_tol": up["lse"],
        "upstream_ratio": _finite_ratio(lerr, up["lse"] * (1 + ref_lse.abs())),
        "ulp_quantiles": _quantiles(lerr / tol.ulp(ref_lse, torch.float32)),
    })
    for r in rows:
        r["headroom"] = (1.0 / r["ratio"]) if r["ratio"] > 0 else math.inf
    return rows


def bias_stats(dtype, out, outs, lses, heads) -> dict:
    from scipy import stats

    from dcp_a2a.reference import lse_weighted_combine

    ref = lse_weighted_combine(outs[:, :, heads], lses[:, :, heads])
    keep = ref != 0
    err = ((out.to(torch.float64) - ref) / tol.ulp(ref, dtype))[keep].numpy()
    sign = torch.sign(ref[keep]).numpy()
    p_signed = float(stats.ttest_1samp(err, 0.0).pvalue)
    p_aligned = float(stats.ttest_1samp(err * sign, 0.0).pvalue)
    return {"dtype": tol.dtype_name(dtype), "elements": int(err.size),
            "mean_ulp": float(err.mean()), "mean_aligned_ulp": float((err * sign).mean()),
            "p_signed": p_signed, "p_aligned": p_aligned, "alpha": ALPHA,
            "unbiased": min(p_signed, p_aligned) > ALPHA / 2}


def mutant_rows(dtype, outs, lses, mutants):
    """Worst err/bound of each degraded merge in ``mutants`` (dcp_a2a.testing.degraded) on
    these partials, the failing fraction, and whether the upstream tolerance accepts it."""
    from .compare import check_merge

    rows = []
    for name, fn in sorted(mutants.items()):
        rep = check_merge(fn(outs, lses), None, outs, lses, keep_ulp_errors=False)
        rows.append({"dtype": tol.dtype_name(dtype), "mutant": name,
                     "ratio": rep.output.worst_ratio,
                     "failing_fraction": rep.output.failures / rep.output.elements,
                     "bound_rejects": not rep.ok, "upstream_accepts": rep.output.upstream_ok})
    return rows


def fp32_mutant_rows(impl, device, seed):
    """The fp32-level mutants on float32 partials with LSEs of 30-50 (rank spread 4), rank 0's
    heads, base e; and the implementation under test on the same partials, for comparison."""
    from .compare import check_merge
    from .degraded import MUTANTS_FP32, fp32_mutant_inputs

    outs, lses = fp32_mutant_inputs(HEADROOM_SHAPE, seed=seed, spread=4.0)
    out, _, heads = merge_rank0(impl, outs, lses, True, device)
    o, s = outs[:, :, heads], lses[:, :, heads]
    rows = mutant_rows(torch.float32, o, s, MUTANTS_FP32)
    rep = check_merge(out, None, o, s, keep_ulp_errors=False)
    rows.append({"dtype": "float32", "mutant": "(implementation under test)",
                 "ratio": rep.output.worst_ratio,
                 "failing_fraction": rep.output.failures / rep.output.elements,
                 "bound_rejects": not rep.ok, "upstream_accepts": rep.output.upstream_ok})
    return rows


# the contract functions the report runs (merge_rank0: pack, exchange, unpack)
NEEDS = ("lse_pack_dim", "pack_send", "unpack_combine")


def build(impl, seed=0, progress=True) -> dict:
    """The report of ``impl`` (a loaded implementation with ``NEEDS``)."""
    from .degraded import MUTANTS

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    quantities, bias, mutants = [], [], []
    steps = [(dt, what) for dt in DTYPES for what in ("headroom", "bias")]
    try:
        from tqdm import tqdm
        it = tqdm(steps, desc="numerics", disable=not progress)
    except ImportError:
        it = steps
    for dtype, what in it:
        if what == "headroom":
            outs, lses = partials(HEADROOM_SHAPE, dtype, seed, spread=4.0)
            for base_e in (True, False):
                out, lse, heads = merge_rank0(impl, outs, lses, base_e, device)
                quantities += quantity_rows(dtype, out, lse, outs, lses, base_e, heads)
            if dtype != torch.float32:
                mutants += mutant_rows(dtype, outs, lses, MUTANTS)
            else:  # at fp32 the 16-bit mutants do not apply; fp32-level ones on LSEs of 30-50
                mutants += fp32_mutant_rows(impl, device, seed)
        elif dtype != torch.float32:  # fp32 has no final rounding to test for bias
            outs, lses = partials(BIAS_SHAPE, dtype, seed + 1, spread=1.0)
            out, _, heads = merge_rank0(impl, outs, lses, True, device)
            bias.append(bias_stats(dtype, out, outs, lses, heads))
    return {"implementation": impl.spec, "device": str(device),
            "tolerances": str(tol.tolerances_path()), "seed": seed,
            "shapes": {"headroom": HEADROOM_SHAPE, "bias": BIAS_SHAPE},
            "quantities": quantities, "bias": bias, "mutants": mutants}


def _fmt(v, spec=".3g"):
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, spec)


def markdown(rep: dict) -> str:
    lines = [f"# Numerics report: {rep['implementation']} on {rep['device']}", "",
             "Errors against the float64 oracle; `ratio` = worst err/bound (must be <= 1), "
             "headroom = 1/ratio; `eval` = share of the fp32 evaluation allowance E used beyond "
             "half an ulp; `upstream` = worst err / (atol + rtol|y*|) of the upstream check.", "",
             "| dtype | quantity | base | N | elements | max abs err | max ulp | ratio | "
             "headroom | eval | misrounded | upstream tol | upstream ratio | p50 ulp | "
             "p99 ulp | p99.9 ulp |",
             "|" + "---|" * 16]
    for r in rep["quantities"]:
        q = r["ulp_quantiles"]
        lines.append(
            f"| {r['dtype']} | {r['quantity']} | {r['base']} | {r['world_size']} | "
            f"{r['elements']} | {_fmt(r['max_abs_err'])} | {_fmt(r['max_ulp_err'])} | "
            f"{_fmt(r['ratio'])} | {_fmt(r['headroom'])} | {_fmt(r['eval_ratio'])} | "
            f"{_fmt(r['misrounded'])} | {_fmt(r['upstream_tol'])} | "
            f"{_fmt(r['upstream_ratio'])} | {_fmt(q.get('p50'))} | {_fmt(q.get('p99'))} | "
            f"{_fmt(q.get('p99.9'))} |")
    lines += ["", f"## Rounding bias (t-tests, family-wise alpha {ALPHA})", "",
              "| dtype | elements | mean ulp | aligned mean ulp | p signed | p aligned | "
              "unbiased |", "|---|---|---|---|---|---|---|"]
    for b in rep["bias"]:
        lines.append(f"| {b['dtype']} | {b['elements']} | {_fmt(b['mean_ulp'])} | "
                     f"{_fmt(b['mean_aligned_ulp'])} | {_fmt(b['p_signed'])} | "
                     f"{_fmt(b['p_aligned'])} | {b['unbiased']} |")
    if rep["mutants"]:
        lines += ["", "## Degraded merges (must be rejected by the bound)", "",
                  "| dtype | mutant | worst err/bound | failing fraction | bound rejects | "
                  "upstream accepts |", "|---|---|---|---|---|---|"]
        for m in rep["mutants"]:
            lines.append(f"| {m['dtype']} | {m['mutant']} | {_fmt(m['ratio'])} | "
                         f"{_fmt(m['failing_fraction'])} | {m['bound_rejects']} | "
                         f"{m['upstream_accepts']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dcp_a2a.testing.numerics_report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--impl", default=None, help="implementation under test (package.module)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from .outpaths import dir_problem

    why = dir_problem(args.out)  # before the runs, not when their results are written
    if why:
        ap.error(f"--out {args.out}: {why}")
    try:
        impl = load_impl(args.impl)
    except ValueError as e:
        ap.error(str(e))
    lacking = [f for f in NEEDS if not impl.has(f)]
    if lacking:  # it runs the exchange through these; a partial one cannot be measured
        ap.error(f"{impl.spec} has no {', '.join(lacking)}: the numerics report merges through "
                 f"{', '.join(NEEDS)}")
    rep = build(impl, args.seed, progress=not args.no_progress)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "numerics.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
    (args.out / "numerics.md").write_text(markdown(rep))
    print(markdown(rep))
    worst = max((r["ratio"] for r in rep["quantities"]), default=0.0)
    ok = worst <= 1.0 and all(b["unbiased"] for b in rep["bias"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
