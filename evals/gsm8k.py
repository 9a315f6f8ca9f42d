"""GSM8K through lm-eval for each DCP backend, with paired statistics against the first one.

    python -m dcp_a2a.evals.gsm8k --backends reference,packed,two_collective,ag_rs --limit 50 \\
        [--model NAME] [--gsm8k-dir DIR] [--lse-base e] [--dcp-size 3]
    torchrun --nproc-per-node N -m dcp_a2a.evals.gsm8k --distributed \\
        --backends reference,packed,two_collective --model qwen2.5-coder-0.5b [...]

Every backend sees the same questions (the first ``--limit`` of the test split, same 5-shot
context: lm-eval's fixed seeds) on the same loaded model (loaded once; the backend is switched
between runs). Per backend and filter (strict-match, flexible-extract): exact match with
lm-eval's stderr. Per backend vs the first backend (the baseline, ``reference`` by default),
per filter: agreement of the extracted answers, correctness flips in each direction, McNemar's
exact test (scipy.stats.binomtest on the discordant pairs, two-sided, p = 0.5), and
generated-token agreement (identical generations; tokens up to the first divergence as a
fraction of the longer generation). Writes ``results.json``, ``results.md`` and per-backend
samples (JSONL) under ``--out``.

Single process: the N DCP ranks are simulated in this process (``--dcp-size``, ``--combine``).
``--distributed`` under torchrun: each process is one rank of a real process group (NCCL on
GPUs, rank r on cuda:r; gloo on the CPU), holds its own KV shard and merges partials with
``dcp_a2a.lse_reduce`` at every decode step; rank 0 runs lm-eval, broadcasts each generate
call to the other ranks, scores and alone writes the results (evals/distributed.py). The DCP
size is then the world size; ``--combine`` and ``--device`` do not apply (refused).

The model (a registered one must be prepared: ``python -m dcp_a2a.evals.prepare --model
NAME``) and both GSM8K splits are checked before anything is loaded: a missing one is one line
naming it and its fix, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import dcp_a2a
import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)

from .distributed import PROCESS_GROUPS
from .inputs import (HelpFormatter, MissingInput, check_device, fail, quiet_git,
                     require_module)
from .model import EVALS_EXTRA, add_model_arguments, dtype_arg, resolve_model
from .records import (FILTERS, em_interval, paired,  # noqa: F401  (paired: evals.pair's)
                      question_records)
from .tasks.gsm8k_local.utils import ENV_VAR, SPLITS, resolve_dir

PROG = "python -m dcp_a2a.evals.gsm8k"
GSM8K_QUESTIONS = 1319  # the test split
MAX_DCP_SIZE = 1024  # ranks simulated in one process
MAX_GEN_TOKS = 32768  # the longest context of the registered models
TASK = "gsm8k_local"
TASKS_DIR = Path(__file__).resolve().parent / "tasks"
BACKENDS = ("reference",) + dcp_a2a.BACKENDS  # reference: unsharded SDPA
KV_CACHES = ("preallocated", "dynamic")  # evals.lm_eval_model.KV_CACHES (no lm-eval import here)


def preflight(args) -> dict:
    """Check, without loading anything heavy, that lm-eval, the model and both GSM8K splits
    are there; returns ``{"model": resolve_model(...), "gsm8k_dir": Path}``."""
    require_module("lm_eval", "lm-eval is not installed", EVALS_EXTRA)
    require_module("transformers", "transformers is not installed", EVALS_EXTRA)
    model = resolve_model(args.model, args.pretrained, args.gguf_file)
    d = resolve_dir(args.gsm8k_dir, need=SPLITS,
                    fix=f"pass --gsm8k-dir DIR or export {ENV_VAR}=DIR (DIR holding "
                        f"{' and '.join(SPLITS)})")
    return {"model": model, "gsm8k_dir": d}


def build_lm(args, first_backend: str, rank_ctx=None):
    """The dcp-hf model (loaded once) for every backend of this run."""
    from .lm_eval_model import DCPHFLM

    return DCPHFLM(model=args.model, pretrained=args.pretrained, gguf_file=args.gguf_file,
                   dtype=args.dtype, device=args.device, dcp_size=args.dcp_size,
                   backend=first_backend, lse_base=args.lse_base, combine=args.combine,
                   shard=args.shard, interleave=args.interleave, wire_dtype=args.wire_dtype,
                   kv_cache=args.kv_cache, batch_size=args.batch_size, dcp_rank=rank_ctx)


def task_manager(gsm8k_dir):
    from lm_eval.tasks import TaskManager

    # include_defaults=False: only our task is indexed (indexing lm-eval's own thousands of
    # task YAMLs costs ~10 s per TaskManager and none of them is used)
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                       metadata={"gsm8k_dir": str(gsm8k_dir)})


def run_backend(lm, backend: str, args, tm, gsm8k_dir) -> dict:
    """lm-eval's GSM8K (task gsm8k_local) on ``lm``, already switched to ``backend``."""
    import lm_eval

    t0 = time.perf_counter()
    with quiet_git():
        res = lm_eval.simple_evaluate(
            model=lm, tasks=[TASK], task_manager=tm, limit=args.limit, log_samples=True,
            gen_kwargs=f"max_gen_toks={args.max_gen_toks}",
            metadata={"gsm8k_dir": str(gsm8k_dir)})
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


def markdown(report: dict) -> str:
    base = report["baseline"]
    c = report["config"]
    where = "ranks simulated in one process"
    if isinstance(c.get("distributed"), dict):
        where = (f"{c['distributed']['world_size']} torchrun ranks, "
                 f"{c['distributed']['process_group']} process group")
    lines = [f"# GSM8K ({c['limit']} questions, 5-shot, greedy, "
             f"max {c['max_gen_toks']} new tokens)", "",
             f"Model {c.get('model', '?')}; DCP N={c['dcp_size']} ({where}), LSE base "
             f"{c['lse_base']}, shard={c['shard']}, combine={c['combine']}, "
             f"dtype={c['dtype']}; paired statistics against `{base}`.", ""]
    if report.get("sources"):  # runs paired from separate directories (evals.pair)
        lines += ["Runs made apart (the settings above are the baseline's; a run's label "
                  "names those in which the runs differ):", ""]
        lines += [f"- `{label}`: {src}" for label, src in report["sources"].items()] + [""]
    for f in FILTERS:
        lines += [f"## {f}", "",
                  "| backend | EM ± stderr | 95 % interval | answer agreement | right→wrong | "
                  "wrong→right | McNemar p | identical generations | token prefix agreement | "
                  "wall s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in report["runs"]:
            em = r["em"][f]
            p = report["paired"].get(r["backend"])
            if p is None:
                cells = ["—"] * 6
            else:
                q = p[f]
                tpa = p.get("token_prefix_agreement")
                cells = [f"{q['answer_agreement']:.3f}", str(q["flips_right_to_wrong"]),
                         str(q["flips_wrong_to_right"]), f"{q['mcnemar_exact_p']:.3g}",
                         f"{p['identical_generations']:.3f}",
                         "n/a" if tpa is None else f"{tpa:.3f}"]
            lo, hi = em_interval(r.get("questions") or [], f)
            ci = "n/a" if lo != lo else f"[{lo:.3f}, {hi:.3f}]"
            lines.append(f"| {r['backend']} | {em['em']:.3f} ± {em['stderr']:.3f} | {ci} | "
                         + " | ".join(cells) + f" | {r['wall_s']:.0f} |")
        lines.append("")
    return "\n".join(lines)



def parser() -> argparse.ArgumentParser:
    from dcp_a2a.testing import args as a

    ap = a.Parser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--backends", default="reference,packed,two_collective,ag_rs",
                    type=a.items(BACKENDS, "backend"),
                    help="comma-separated, from " + ", ".join(BACKENDS) + "; the first is the "
                         "baseline of the paired statistics")
    ap.add_argument("--limit", type=a.count(1, GSM8K_QUESTIONS), default=50,
                    help=f"the first LIMIT questions of the test split ({GSM8K_QUESTIONS}: all)")
    ap.add_argument("--batch-size", type=a.positive_int, default=8,
                    help="questions per generate call")
    ap.add_argument("--max-gen-toks", type=a.count(1, MAX_GEN_TOKS), default=256,
                    help=f"new tokens at most per answer (greedy), 1 to {MAX_GEN_TOKS}")
    ap.add_argument("--dcp-size", type=a.count(1, MAX_DCP_SIZE), default=None,
                    help=f"DCP ranks N, 1 to {MAX_DCP_SIZE}, simulated in this process; 3 when "
                         "not given (with --distributed: the world size, which a value here "
                         "must equal)")
    ap.add_argument("--lse-base", default="e", choices=("e", "2"),
                    help="base of the partials' log-sum-exp")
    ap.add_argument("--combine", default="auto", choices=("auto", "triton", "reference"),
                    help="single process: auto = dcp_a2a's Triton kernels on CUDA, the "
                         "pure-PyTorch reference wire path on the CPU")
    ap.add_argument("--shard", default="decode", choices=("decode", "all"),
                    help="decode: DCP on decode steps, prefill unsharded (as engines do); all: "
                         "prefill sharded too (single process only)")
    ap.add_argument("--interleave", type=a.positive_int, default=1,
                    help="KV interleave: position j lives on rank (j // I) %% N")
    ap.add_argument("--dtype", default="float32", type=dtype_arg,
                    help="model dtype: float32, bfloat16, float16, float64 or auto")
    ap.add_argument("--wire-dtype", default=None, choices=("float32", "bfloat16", "float16"),
                    help="dtype of the partials on the wire; the model dtype when not given (a "
                         "float64 model needs float32)")
    ap.add_argument("--kv-cache", default="preallocated", choices=KV_CACHES,
                    help="preallocated = one buffer per layer for the prompt and every new "
                         "token, written in place; dynamic = transformers' DynamicCache (copies "
                         "the cache at every step); the same generations (with --distributed: "
                         "the reference backend's cache; a DCP rank holds its shard)")
    ap.add_argument("--device", default=None,
                    help="cuda if available, else cpu, when not given (with --distributed: "
                         "see --process-group)")
    add_model_arguments(ap)
    ap.add_argument("--gsm8k-dir", default=None, type=a.existing_dir,
                    help=f"directory with train.jsonl and test.jsonl; when not given ${ENV_VAR}, "
                         "else ../shared/data/gsm8k next to the checkout")
    ap.add_argument("--out", default="out/gsm8k", type=a.out_dir,
                    help="output directory, created if missing (rank 0 writes it)")
    ap.add_argument("--distributed", action="store_true",
                    help="one rank of a real DCP process group under torchrun (see above)")
    ap.add_argument("--process-group", default="auto", choices=PROCESS_GROUPS,
                    help="with --distributed: auto is NCCL on cuda:LOCAL_RANK where CUDA is "
                         "available, else gloo on the CPU; gloo with CUDA lets ranks share "
                         "GPUs (rank r on cuda:(LOCAL_RANK mod GPUs)): the multi-rank path on "
                         "fewer GPUs than ranks, a correctness run, not a speed one")
    return ap


def check_args(ap, args) -> None:
    """What argparse cannot check alone: combinations, the device, the output directory --
    a usage error (one line, exit 2) before anything is loaded."""
    if args.distributed:
        if args.shard != "decode":
            ap.error("--distributed shards decode steps only (--shard decode)")
        if args.device is not None:
            ap.error("--device: with --distributed each rank's device follows --process-group")
        if args.combine != "auto":
            ap.error("--combine: with --distributed each rank merges with dcp_a2a.lse_reduce "
                     "on the process group")
    elif args.process_group != "auto":
        ap.error(f"--process-group {args.process_group} picks the group of --distributed "
                 "ranks; a single process simulates its ranks without one")
    try:
        check_device(args.device)
    except ValueError as e:
        ap.error(f"argument --device: {e}")
    if args.wire_dtype is None and args.dtype in ("float64", "fp64") and any(
            b != "reference" for b in args.backends):
        ap.error("--dtype float64 needs --wire-dtype float32 (or bfloat16, float16): the "
                 "combine kernels take no float64 partials")


def main(argv=None) -> dict | None:
    """Run (see the module docstring); the report on rank 0, None on the other ranks."""
    ap = parser()
    args = ap.parse_args(argv)
    check_args(ap, args)
    rank = None
    if args.distributed:
        from .distributed import torchrun_rank

        rank = torchrun_rank()
        if rank is None:
            fail(PROG, MissingInput("--distributed needs torchrun's environment (RANK, "
                                    "WORLD_SIZE)", "torchrun --nproc-per-node N -m "
                                    "dcp_a2a.evals.gsm8k --distributed ..."))
        world = int(os.environ["WORLD_SIZE"])
        if args.dcp_size not in (None, world):
            ap.error(f"--dcp-size {args.dcp_size} but torchrun started {world} ranks "
                     "(with --distributed the DCP group is the world)")
    backends = args.backends
    args.backends = ",".join(backends)  # as given, for the results' config
    try:
        found = preflight(args)
    except MissingInput as e:
        fail(PROG, e, quiet=bool(rank))  # every rank fails alike; rank 0 says it once
    if args.distributed:
        return _main_distributed(args, backends, found)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.dcp_size is None:
        args.dcp_size = 3
    lm = build_lm(args, backends[0])
    tm = task_manager(found["gsm8k_dir"])
    runs = []
    for b in backends:
        lm.set_backend(b)
        runs.append(_one_backend(lm, b, args, tm, found, runs))
    return _write(Path(args.out), args, found, runs, lm.tokenizer)


def _one_backend(lm, b, args, tm, found, runs) -> dict:
    """Run backend ``b``, write its samples and the results so far."""
    r = run_backend(lm, b, args, tm, found["gsm8k_dir"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"samples_{b}.jsonl", "w") as fh:
        for s in r["samples"]:
            fh.write(json.dumps(s) + "\n")
    print(f"{b}: " + ", ".join(f"{f} {r['em'][f]['em']:.3f}" for f in FILTERS)
          + f" ({r['wall_s']:.0f} s)", flush=True)
    _write(out, args, found, runs + [r], lm.tokenizer)  # partial results after each backend
    return r


def _main_distributed(args, backends, found):
    from . import distributed as dd

    ctx = dd.init_from_env(args.process_group)
    clean = False
    try:
        args.dcp_size, args.device = ctx.world_size, ctx.device
        lm = build_lm(args, "reference", rank_ctx=ctx)
        args.combine = "dcp_a2a.lse_reduce on the process group"  # for the report
        args.distributed = ctx.describe()
        if ctx.rank != 0:
            dd.serve(lm)
            clean = True
            return None
        tm = task_manager(found["gsm8k_dir"])
        runs = []
        try:
            for b in backends:
                dd.set_backend(lm, b)
                r = _one_backend(lm, b, args, tm, found, runs)
                r["rank_token_mismatches"] = dd.sum_mismatches(lm)
                runs.append(r)
            report = _write(Path(args.out), args, found, runs, lm.tokenizer)
        except BaseException as e:
            dd.finish(lm, e)
            raise
        dd.finish(lm)
        clean = True
        return report
    finally:
        dd.leave(clean)


def _write(out: Path, args, found, runs, tokenizer) -> dict:
    """results.json and results.md of the runs so far (rank 0 only)."""
    base = runs[0]
    config = dict(vars(args))
    config["model"] = found["model"]["model"]
    config["gsm8k_dir"] = str(found["gsm8k_dir"])
    report = {"config": config, "baseline": base["backend"],
              "runs": [{**{k: v for k, v in r.items() if k != "samples"},
                        "questions": question_records(r["samples"])} for r in runs],
              "paired": {r["backend"]: paired(base, r, tokenizer) for r in runs[1:]}}
    write_report(out, report)
    return report


def write_report(out: Path, report: dict) -> None:
    """``results.json`` and ``results.md`` of ``report`` under ``out`` (also evals.pair's)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(markdown(report))


if __name__ == "__main__":
    main()
    from .distributed import exit_if_left_cleanly

    exit_if_left_cleanly()  # a torchrun rank ends here, past gloo's teardown at exit
