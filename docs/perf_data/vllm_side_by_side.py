"""vLLM's own packed-A2A kernels timed beside ours and the engine-design baseline, in the same
interleaved rounds on one GPU (issue 47: does the baseline reproduce the engine's kernel, and
is ours ahead of the engine's kernel itself, not only of our code of its design?).

    unzip -p vllm-0.34.0-*.whl vllm/v1/attention/ops/dcp.py > /tmp/vllm_dcp.py
    python docs/perf_data/vllm_side_by_side.py /tmp/vllm_dcp.py [OUT.json] [--rounds 7]
    python docs/perf_data/vllm_side_by_side.py FILE OUT.json --smoke
        (tiny shapes, wall clock, the interpreter on a CPU: the structure only)

FILE is vLLM's published source of its DCP ops (the wheel on PyPI holds it; pip download
vllm==0.34.0 --no-deps). Only the definitions named in ``ENGINE_NAMES`` are read from it, by
name, and loaded as a module of their own next to the JSON (the rest of that file imports
vLLM's engine); nothing of vLLM's is kept in this repository.

1. Graph replay at the issue's 17 rows: our unpack-combine, the engine-design baseline
   (:mod:`dcp_a2a.testing.engine_design`) and vLLM's ``_dcp_a2a_unpack_combine`` (its wrapper:
   allocate, grid, launch; allocation is free on replay), ``--rounds`` interleaved rounds
   (``bench.timed_rounds``); per row the medians, and the medians of the per-round ratios
   baseline / vLLM (with its 95 % interval: the baseline reproduces the engine's kernel where
   it lies within 0.95-1.05) and ours / vLLM (its verdict at 0.95). Before any timing each
   output is compared: vLLM's and the baseline's with ours within 2^-6, and whether the
   baseline equals vLLM's bit for bit is recorded.
2. Eager calls at the issue's eager rows (1000 back-to-back calls synchronised at the end,
   median of 5; ``eager.eager_us``): our pack_send and unpack_combine, vLLM's
   ``_dcp_a2a_pack_send`` and ``_dcp_a2a_unpack_combine``, the baseline's wrapper, and the
   ratios ours / vLLM, in one process so the host is the same for all.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import dcp_a2a  # noqa: E402
from dcp_a2a.testing import bench, eager, engine_design  # noqa: E402

import issue47_probe as probe  # noqa: E402

# vLLM's definitions the probe loads from FILE, in the order they are defined
ENGINE_NAMES = ("_validate_dcp_empty_shard_args", "_dcp_a2a_pack_send_kernel",
                "_dcp_a2a_unpack_combine_kernel", "_dcp_a2a_pack_send",
                "_dcp_a2a_unpack_combine")
_PRELUDE = ("from __future__ import annotations\n\nimport torch\nimport triton\n"
            "import triton.language as tl\n\n\n")


def load_engine(path, workdir):
    """The module of ``ENGINE_NAMES`` defined in ``path`` (decorators kept), written to
    ``workdir`` so Triton can read the kernels' source. ValueError naming what is missing."""
    source = Path(path).read_text()
    lines = source.splitlines(keepends=True)
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in ENGINE_NAMES:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            found[node.name] = "".join(lines[first:node.end_lineno])
    missing = [n for n in ENGINE_NAMES if n not in found]
    if missing:
        raise ValueError(f"{path} does not define {', '.join(missing)} (vLLM's "
                         "vllm/v1/attention/ops/dcp.py expected)")
    file = Path(workdir) / "vllm_dcp_engine.py"
    file.write_text(_PRELUDE + "\n\n".join(found[n] for n in ENGINE_NAMES))
    spec = importlib.util.spec_from_file_location("vllm_dcp_engine", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _median_ratio(times, a, b):
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def graph_row(engine, point, device, rounds, timer):
    b, h, d, n, dt = point
    p, recv, nbytes = probe.wire(b, h, d, n, dt, device)
    v = {"ours": lambda: dcp_a2a.unpack_combine(recv, d, p, False, True),
         "engine": lambda: engine_design.unpack_combine(recv, d),
         "vllm": lambda: engine._dcp_a2a_unpack_combine(recv, d, p, False, True)}
    got = {k: fn() for k, fn in v.items()}
    for k in ("engine", "vllm"):
        if not torch.allclose(got[k].float(), got["ours"].float(), rtol=2 ** -6, atol=2 ** -6):
            raise AssertionError(f"{k} differs from ours beyond 2^-6 at {point}")
    same_bits = torch.equal(got["engine"].view(torch.uint8), got["vllm"].view(torch.uint8))
    med, times, method = bench.timed_rounds(v, nbytes, rounds, timer)
    e_lo, e_hi, _ = bench.ratio_verdict(times["engine"], times["vllm"], 1.05)
    o_lo, o_hi, verdict = bench.ratio_verdict(times["ours"], times["vllm"], bench.TARGET_RATIO)
    issue = probe.ISSUE_VLLM_US.get(tuple(point))
    return {"B": b, "H": h, "D": d, "N": n, "dtype": dt, "bytes": nbytes, "timing": method,
            "rounds": rounds, "median_us": med, "times_us": times,
            "engine_equals_vllm_bitwise": same_bits,
            "engine_over_vllm": _median_ratio(times, "engine", "vllm"),
            "engine_over_vllm_ci": [e_lo, e_hi],
            "ours_over_vllm": _median_ratio(times, "ours", "vllm"),
            "ours_over_vllm_ci": [o_lo, o_hi], "ours_over_vllm_verdict": verdict,
            "ours_over_engine": _median_ratio(times, "ours", "engine"),
            "vllm_over_issue_vllm": med["vllm"] / issue if issue else None}


def graph_table(rows):
    head = (f"{'B':>4} {'H':>4} {'D':>4} {'N':>2} {'dtype':<8} {'ours':>6} {'eng':>6} "
            f"{'vllm':>6} {'eng/vllm':>8} {'95% interval':>15} {'bits':>4} {'ours/vllm':>9} "
            f"{'95% interval':>15} {'v':>4} {'vllm/issue':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        m = r["median_us"]
        (el, eh), (ol, oh) = r["engine_over_vllm_ci"], r["ours_over_vllm_ci"]
        issue = r["vllm_over_issue_vllm"]
        lines.append(
            f"{r['B']:>4} {r['H']:>4} {r['D']:>4} {r['N']:>2} {r['dtype']:<8} "
            f"{m['ours']:6.2f} {m['engine']:6.2f} {m['vllm']:6.2f} {r['engine_over_vllm']:8.3f} "
            f"[{el:6.3f},{eh:6.3f}] {'=' if r['engine_equals_vllm_bitwise'] else '~':>4} "
            f"{r['ours_over_vllm']:9.3f} [{ol:6.3f},{oh:6.3f}] "
            f"{bench._MARK[r['ours_over_vllm_verdict']]:>4} "
            + (f"{issue:10.3f}" if issue else f"{'-':>10}"))
    lines.append(f"us: medians over {rows[0]['rounds']} interleaved rounds ({rows[0]['timing']});"
                 " ratios: medians of the per-round ratios, 95 % intervals of their geometric "
                 "mean; bits: the baseline's output equals vLLM's bit for bit (=) or within "
                 f"2^-6 (~); v: ours <= {bench.TARGET_RATIO} x vLLM's kernel (ok met, ? "
                 "undecided, MISS missed); vllm/issue: vLLM's kernel here over the issue's "
                 "vLLM column")
    return "\n".join(lines)


# an eager op of ours (or the baseline's) -> vLLM's op it is compared with
_THEIRS = {"pack_send": "vllm_pack", "unpack_combine": "vllm_unpack",
           "engine_unpack": "vllm_unpack"}


def eager_rows(engine, point, device, calls, repeats):
    b, h, d, n, dt = point
    p, hpr, out, lse, send, recv = eager.inputs(b, h, d, n, dt, device)
    theirs = torch.full_like(send, float("nan"))
    engine._dcp_a2a_pack_send(out, lse, theirs, n, hpr, d, p)
    if not torch.equal(theirs.view(torch.uint8), send.view(torch.uint8)):
        raise AssertionError(f"vLLM's pack wrote another wire than ours at {point}")
    fns = {"pack_send": lambda: dcp_a2a.pack_send(out, lse, send, n, hpr, d, p),
           "vllm_pack": lambda: engine._dcp_a2a_pack_send(out, lse, send, n, hpr, d, p),
           "unpack_combine": lambda: dcp_a2a.unpack_combine(recv, d, p, False, True),
           "vllm_unpack": lambda: engine._dcp_a2a_unpack_combine(recv, d, p, False, True),
           "engine_unpack": lambda: engine_design.unpack_combine(recv, d)}
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else None
    us = {k: eager.eager_us(fn, calls, repeats, sync) for k, fn in fns.items()}
    shape = f"B={b} H={h} D={d} N={n} {dt}"
    return [{"shape": shape, "op": k, "us": m, "runs_us": runs, "calls": calls,
             "repeats": repeats, "over_vllm": m / us[_THEIRS[k]][0] if k in _THEIRS else None}
            for k, (m, runs) in us.items()]


def eager_table(rows):
    head = f"{'shape':32} {'op':16} {'us/call':>8} {'min':>8} {'max':>8} {'/ vllm':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['over_vllm']:7.3f}" if r["over_vllm"] is not None else f"{'':7}"
        lines.append(f"{r['shape']:32} {r['op']:16} {r['us']:8.2f} {min(r['runs_us']):8.2f} "
                     f"{max(r['runs_us']):8.2f} {ratio}")
    lines.append(f"eager: {rows[0]['calls']} back-to-back calls synchronised at the end, median "
                 f"of {rows[0]['repeats']}; / vllm: over vLLM's wrapper of the same op, this run")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine_file", help="vLLM's vllm/v1/attention/ops/dcp.py")
    ap.add_argument("out", nargs="?", default="vllm_side_by_side.json", help="JSON report")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds a row")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, wall-clock timer: structure only")
    args = ap.parse_args(argv)
    run = probe.run_settings(args.smoke, args.rounds, "vllm_side_by_side.py")
    if run is None:
        return 2
    device, rows, eager_at, timer, rounds, calls, repeats = run
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    engine = load_engine(args.engine_file, out.parent)
    t0 = time.time()
    graph = []
    for point in rows:
        graph.append(graph_row(engine, point, device, rounds, timer))
        print(f"  graph {point}: engine/vllm {graph[-1]['engine_over_vllm']:.3f} "
              f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    eager_rows_ = [r for point in eager_at
                   for r in eager_rows(engine, point, device, calls, repeats)]
    import triton

    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "smoke": args.smoke,
              "engine_file": str(args.engine_file), "seconds": time.time() - t0,
              "graph": graph, "eager": eager_rows_}
    out.write_text(json.dumps(report, indent=1))
    print(f"device {report['device']}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{report['seconds']:.0f} s; {out}")
    print(graph_table(graph))
    print()
    print(eager_table(eager_rows_))
    return 0


if __name__ == "__main__":
    sys.exit(main())
