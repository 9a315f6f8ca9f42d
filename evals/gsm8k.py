"""GSM8K through lm-eval for each DCP backend, with paired statistics against ``reference``.

    python -m evals.gsm8k --backends reference,packed,two_collective,ag_rs --limit 50 \\
        --out out/gsm8k [--gsm8k-dir ../shared/data/gsm8k] [--lse-base e] [--dcp-size 3]

Every backend sees the same questions (the first ``--limit`` of the test split, same 5-shot
context: lm-eval's fixed seeds). Per backend and filter (strict-match, flexible-extract): exact
match with lm-eval's stderr. Per backend vs the first backend (the baseline, ``reference`` by
default), per filter: agreement of the extracted answers, correctness flips in each direction,
McNemar's exact test (scipy.stats.binomtest on the discordant pairs, two-sided, p = 0.5), and
generated-token agreement (identical generations; tokens up to the first divergence as a
fraction of the longer generation). Writes ``results.json``, ``results.md`` and per-backend
samples (JSONL) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)

FILTERS = ("strict-match", "flexible-extract")
TASK = "gsm8k_local"
TASKS_DIR = Path(__file__).resolve().parent / "tasks"


def run_backend(backend: str, args) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    from . import lm_eval_model  # noqa: F401  (registers dcp-hf)

    model_args = {"backend": backend, "dcp_size": args.dcp_size, "lse_base": args.lse_base,
                  "combine": args.combine, "shard": args.shard, "interleave": args.interleave,
                  "dtype": args.dtype, "device": args.device}
    if args.pretrained:
        model_args["pretrained"] = args.pretrained
    if args.gguf_file:
        model_args["gguf_file"] = args.gguf_file
    metadata = {"gsm8k_dir": args.gsm8k_dir} if args.gsm8k_dir else {}
    tm = TaskManager(include_path=str(TASKS_DIR), metadata=metadata)
    t0 = time.perf_counter()
    res = lm_eval.simple_evaluate(
        model="dcp-hf", model_args=model_args, tasks=[TASK], task_manager=tm,
        limit=args.limit, batch_size=args.batch_size, log_samples=True,
        gen_kwargs=f"max_gen_toks={args.max_gen_toks}", metadata=metadata)
    wall = time.perf_counter() - t0
    r = res["results"][TASK]
    # lm-eval reports the stderr as the string "N/A" for a single question
    em = {f: {"em": r[f"exact_match,{f}"], "stderr": _number(r[f"exact_match_stderr,{f}"])}
          for f in FILTERS}
    per_doc: dict[int, dict] = {}
    for s in res["samples"][TASK]:
        d = per_doc.setdefault(int(s["doc_id"]), {"doc_id": int(s["doc_id"]),
                                                  "target": s["target"],
                                                  "generation": s["resps"][0][0]})
        d[s["filter"]] = {"answer": s["filtered_resps"][0], "correct": float(s["exact_match"])}
    return {"backend": backend, "wall_s": wall, "em": em,
            "samples": [per_doc[k] for k in sorted(per_doc)]}


def _number(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def paired(base: dict, other: dict, tokenizer) -> dict:
    """Per-question paired statistics of ``other`` against ``base`` (same doc ids)."""
    from scipy.stats import binomtest

    a = {s["doc_id"]: s for s in base["samples"]}
    b = {s["doc_id"]: s for s in other["samples"]}
    ids = sorted(set(a) & set(b))
    out: dict = {"n": len(ids)}
    for f in FILTERS:
        agree = sum(a[i][f]["answer"] == b[i][f]["answer"] for i in ids)
        lost = sum(a[i][f]["correct"] > b[i][f]["correct"] for i in ids)  # base right, other wrong
        gained = sum(a[i][f]["correct"] < b[i][f]["correct"] for i in ids)
        p = binomtest(lost, lost + gained, 0.5).pvalue if lost + gained else 1.0
        out[f] = {"answer_agreement": agree / len(ids) if ids else float("nan"),
                  "flips_right_to_wrong": lost, "flips_wrong_to_right": gained,
                  "mcnemar_exact_p": p}
    same, prefix = 0, []
    for i in ids:
        ta = tokenizer(a[i]["generation"], add_special_tokens=False)["input_ids"]
        tb = tokenizer(b[i]["generation"], add_special_tokens=False)["input_ids"]
        k = 0
        while k < min(len(ta), len(tb)) and ta[k] == tb[k]:
            k += 1
        same += ta == tb
        # identical generations (also two empty ones) agree fully
        prefix.append(1.0 if ta == tb else k / max(len(ta), len(tb)))
    out["identical_generations"] = same / len(ids) if ids else float("nan")
    out["token_prefix_agreement"] = sum(prefix) / len(prefix) if prefix else float("nan")
    return out


def markdown(report: dict) -> str:
    base = report["baseline"]
    lines = [f"# GSM8K ({report['config']['limit']} questions, 5-shot, greedy, "
             f"max {report['config']['max_gen_toks']} new tokens)", "",
             f"DCP N={report['config']['dcp_size']}, LSE base {report['config']['lse_base']}, "
             f"shard={report['config']['shard']}, combine={report['config']['combine']}, "
             f"dtype={report['config']['dtype']}; paired statistics against `{base}`.", ""]
    for f in FILTERS:
        lines += [f"## {f}", "",
                  "| backend | EM ± stderr | answer agreement | right→wrong | wrong→right | "
                  "McNemar p | identical generations | token prefix agreement | wall s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in report["runs"]:
            em = r["em"][f]
            p = report["paired"].get(r["backend"])
            if p is None:
                cells = ["—"] * 6
            else:
                q = p[f]
                cells = [f"{q['answer_agreement']:.3f}", str(q["flips_right_to_wrong"]),
                         str(q["flips_wrong_to_right"]), f"{q['mcnemar_exact_p']:.3g}",
                         f"{p['identical_generations']:.3f}",
                         f"{p['token_prefix_agreement']:.3f}"]
            lines.append(f"| {r['backend']} | {em['em']:.3f} ± {em['stderr']:.3f} | "
                         + " | ".join(cells) + f" | {r['wall_s']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> dict:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="reference,packed,two_collective,ag_rs",
                    help="comma-separated; the first is the baseline of the paired statistics")
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-gen-toks", type=int, default=256)
    ap.add_argument("--dcp-size", type=int, default=3)
    ap.add_argument("--lse-base", default="e", choices=("e", "2"))
    ap.add_argument("--combine", default="auto", choices=("auto", "triton", "reference"))
    ap.add_argument("--shard", default="decode", choices=("decode", "all"),
                    help="decode: DCP on decode steps, prefill unsharded (default); all: "
                         "prefill sharded too")
    ap.add_argument("--interleave", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default=None)
    ap.add_argument("--pretrained", default=None, help="HF id or path (default: SmolLM2 GGUF)")
    ap.add_argument("--gguf-file", default=None)
    ap.add_argument("--gsm8k-dir", default=None,
                    help="directory with train.jsonl/test.jsonl (default: $DCP_GSM8K_DIR or "
                         "../shared/data/gsm8k)")
    ap.add_argument("--out", default="out/gsm8k")
    args = ap.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    backends = [b for b in args.backends.split(",") if b]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for b in tqdm(backends, desc="backends"):
        r = run_backend(b, args)
        runs.append(r)
        with open(out / f"samples_{b}.jsonl", "w") as fh:
            for s in r["samples"]:
                fh.write(json.dumps(s) + "\n")
        tqdm.write(f"{b}: " + ", ".join(f"{f} {r['em'][f]['em']:.3f}" for f in FILTERS)
                   + f" ({r['wall_s']:.0f} s)")
        _write(out, args, backends, runs)
    return _write(out, args, backends, runs)


def _write(out: Path, args, backends, runs) -> dict:
    from transformers import AutoTokenizer

    from .model import default_model_args

    if args.pretrained:
        kw = {"gguf_file": args.gguf_file} if args.gguf_file else {}
        tok = AutoTokenizer.from_pretrained(args.pretrained, **kw)
    else:
        d = default_model_args()
        tok = AutoTokenizer.from_pretrained(d["pretrained"], gguf_file=d["gguf_file"])
    base = runs[0]
    report = {"config": vars(args), "baseline": base["backend"],
              "runs": [{k: v for k, v in r.items() if k != "samples"} for r in runs],
              "paired": {r["backend"]: paired(base, r, tok) for r in runs[1:]}}
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(markdown(report))
    return report


if __name__ == "__main__":
    main()
