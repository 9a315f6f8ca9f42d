"""Logit parity: teacher-forced next-token logits of the DCP model vs the unsharded model.

    python -m dcp_a2a.evals.logit_parity [--model NAME] [--limit 64]
        [--dtypes float32,bfloat16] [--bases e,2] [--backends packed,two_collective,ag_rs]
        [--dcp-size 3] [--out out/logit_parity]

Texts: the first ``--limit`` GSM8K test questions with their reference answers
("Question: ...\\nAnswer: ..."), right-padded in batches. Every attention call is sharded
(``shard="all"``: prefill through the combine at every position). Per dtype, backend and LSE
base, over all non-padding positions: max |Δlogit|, mean KL(p_ref || p_dcp) (float32 softmax),
top-1 agreement, against the same model with transformers' SDPA attention (``reference``).
Writes ``logit_parity.json`` and ``logit_parity.md``.

Reads only GSM8K's test.jsonl. The model (a registered one must be prepared: ``python -m
dcp_a2a.evals.prepare --model NAME``) and the data are checked before anything is loaded: a
missing one is one line naming it and its fix, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)

import torch

from .inputs import HelpFormatter, MissingInput, check_device, fail, require_module
from .model import DTYPE_NAMES, EVALS_EXTRA, add_model_arguments, resolve_model
from .tasks.gsm8k_local.utils import ENV_VAR, resolve_dir

PROG = "python -m dcp_a2a.evals.logit_parity"
GSM8K_QUESTIONS = 1319  # the test split
MAX_DCP_SIZE = 1024  # ranks simulated in one process
NEEDS = ("test.jsonl",)  # the texts are test questions with their answers; no few-shot


def data_dir(gsm8k_dir=None):
    """The GSM8K directory holding test.jsonl (:class:`MissingInput` naming the fix)."""
    return resolve_dir(gsm8k_dir, need=NEEDS,
                       fix=f"pass --gsm8k-dir DIR or export {ENV_VAR}=DIR (DIR holding "
                           "test.jsonl)")


def gsm8k_texts(limit: int, gsm8k_dir=None) -> list[str]:
    d = data_dir(gsm8k_dir)
    texts = []
    with open(d / "test.jsonl") as fh:
        for line in fh:
            if len(texts) >= limit:
                break
            ex = json.loads(line)
            texts.append(f"Question: {ex['question']}\nAnswer: {ex['answer']}")
    return texts


def compare_logits(ref: torch.Tensor, got: torch.Tensor, mask: torch.Tensor) -> dict:
    """Sums over the valid positions (mask [B, T] bool) of ref/got logits [B, T, V]."""
    r = ref[mask].float()
    g = got[mask].float()
    lr = torch.log_softmax(r, dim=-1)
    lg = torch.log_softmax(g, dim=-1)
    kl = (lr.exp() * (lr - lg)).sum(-1)
    return {"max_abs": (r - g).abs().max().item(), "kl_sum": kl.sum().item(),
            "top1_same": (r.argmax(-1) == g.argmax(-1)).sum().item(), "n": int(mask.sum()),
            "nonfinite": int((~torch.isfinite(g)).sum())}


def _new_acc() -> dict:
    return {"max_abs": 0.0, "kl_sum": 0.0, "top1_same": 0, "n": 0, "nonfinite": 0, "wall_s": 0.0}


def _add(acc: dict, c: dict, seconds: float) -> None:
    """Fold one batch's :func:`compare_logits` into a row's running totals."""
    acc["max_abs"] = max(acc["max_abs"], c["max_abs"])
    for k in ("kl_sum", "top1_same", "n", "nonfinite"):
        acc[k] += c[k]
    acc["wall_s"] += seconds


def run(args) -> dict:
    from tqdm import tqdm

    from .dcp_attention import DCPSettings, attach_dcp, detach_dcp
    from .model import load_model

    texts = gsm8k_texts(args.limit, args.gsm8k_dir)
    backends, bases = args.backends, args.bases
    rows = []
    for dtype in args.dtypes:
        model, tok = load_model(args.pretrained, args.gguf_file, dtype=dtype, device=args.device,
                                model=args.model)
        # The floor of a 16-bit run: how far the unsharded model in that dtype is from the
        # unsharded float32 model. DCP's distance to the unsharded 16-bit model is read against it.
        floor_model = None
        if args.floor and dtype not in ("float32", "fp32"):
            floor_model, _ = load_model(args.pretrained, args.gguf_file, dtype="float32",
                                        device=args.device, model=args.model)
        floor = _new_acc()
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        acc = {(b, s): _new_acc() for b in backends for s in bases}
        ref_wall = 0.0
        batches = [texts[i:i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
        for chunk in tqdm(batches, desc=f"logit parity {dtype}"):
            enc = tok(chunk, return_tensors="pt", padding=True, padding_side="right").to(
                args.device)
            mask = enc["attention_mask"].bool()
            with torch.no_grad():
                detach_dcp(model)
                t0 = time.perf_counter()
                ref = model(**enc).logits
                ref_wall += time.perf_counter() - t0
                if floor_model is not None:
                    t0 = time.perf_counter()
                    f32 = floor_model(**enc).logits
                    _add(floor, compare_logits(f32, ref, mask), time.perf_counter() - t0)
                for b in backends:
                    for s in bases:
                        attach_dcp(model, DCPSettings(world_size=args.dcp_size, backend=b,
                                                      lse_base=s, combine=args.combine,
                                                      shard="all", interleave=args.interleave))
                        t0 = time.perf_counter()
                        got = model(**enc).logits
                        _add(acc[(b, s)], compare_logits(ref, got, mask),
                             time.perf_counter() - t0)
            del ref
        if floor_model is not None:
            acc[("unsharded float32 -> " + dtype, "-")] = floor
        for (b, s), a in acc.items():
            rows.append({"dtype": dtype, "backend": b, "lse_base": s, "positions": a["n"],
                         "max_abs_dlogit": a["max_abs"], "mean_kl": a["kl_sum"] / a["n"],
                         "top1_agreement": a["top1_same"] / a["n"],
                         "nonfinite": a["nonfinite"], "wall_s": a["wall_s"],
                         "reference_wall_s": ref_wall})
        del model, floor_model
    config = {k: ",".join(v) if isinstance(v, list) else v for k, v in vars(args).items()}
    return {"config": config, "texts": len(texts), "rows": rows}


def markdown(report: dict) -> str:
    c = report["config"]
    lines = [f"# Logit parity: DCP (N={c['dcp_size']}, combine={c['combine']}, interleave="
             f"{c['interleave']}) vs unsharded SDPA", "",
             f"{report['texts']} GSM8K test question+answer texts, teacher forced, every "
             "position through the combine. Rows `unsharded float32 -> <dtype>`: the unsharded "
             "model in that dtype against the unsharded float32 model (the dtype's own error, the "
             "floor to read the DCP rows of that dtype against).", "",
             "| dtype | backend | LSE base | positions | max abs Δlogit | mean KL | top-1 agree "
             "| non-finite | wall s (ref s) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['dtype']} | {r['backend']} | {r['lse_base']} | {r['positions']} | "
                     f"{r['max_abs_dlogit']:.3g} | {r['mean_kl']:.3g} | "
                     f"{r['top1_agreement']:.4f} | {r['nonfinite']} | {r['wall_s']:.0f} "
                     f"({r['reference_wall_s']:.0f}) |")
    return "\n".join(lines) + "\n"



def _dtypes(value: str) -> list[str]:
    """Distinct model dtypes: two names of one dtype (float32,fp32) would compare it twice."""
    from dcp_a2a.testing import args as a

    from .model import parse_dtype

    names = a.items(DTYPE_NAMES, "dtype")(value)
    seen = {}
    for name in names:
        same = seen.setdefault(parse_dtype(name), name)
        if same != name:
            raise argparse.ArgumentTypeError(f"dtypes {same} and {name} are the same dtype")
    return names


def parser() -> argparse.ArgumentParser:
    from dcp_a2a.testing import args as a

    from .dcp_attention import BACKENDS

    ap = a.Parser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--limit", type=a.count(1, GSM8K_QUESTIONS), default=64,
                    help=f"the first LIMIT GSM8K test questions (with their answers; "
                         f"{GSM8K_QUESTIONS}: all)")
    ap.add_argument("--batch-size", type=a.positive_int, default=8,
                    help="texts per forward pass")
    ap.add_argument("--dtypes", default="float32,bfloat16", type=_dtypes,
                    help="comma-separated distinct model dtypes, each loaded and compared on its "
                         "own")
    ap.add_argument("--bases", default="e,2", type=a.items(("e", "2"), "LSE base"),
                    help="comma-separated LSE bases (e, 2)")
    ap.add_argument("--backends", default="packed,two_collective,ag_rs",
                    type=a.items(BACKENDS, "backend"),
                    help="comma-separated DCP backends compared with the unsharded model")
    ap.add_argument("--dcp-size", type=a.count(1, MAX_DCP_SIZE), default=3,
                    help=f"simulated DCP ranks N, 1 to {MAX_DCP_SIZE}")
    ap.add_argument("--combine", default="auto", choices=("auto", "triton", "reference"),
                    help="auto = dcp_a2a's Triton kernels on CUDA, the pure-PyTorch reference "
                         "wire path on the CPU")
    ap.add_argument("--interleave", type=a.positive_int, default=1,
                    help="KV interleave: position j lives on rank (j // I) %% N")
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="skip the unsharded float32 vs 16-bit floor rows")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device")
    add_model_arguments(ap)
    ap.add_argument("--gsm8k-dir", default=None, type=a.existing_dir,
                    help=f"directory with test.jsonl; when not given ${ENV_VAR}, else "
                         "../shared/data/gsm8k next to the checkout")
    ap.add_argument("--out", default="out/logit_parity", type=a.out_dir,
                    help="output directory, created if missing")
    return ap


def parse_args(argv=None):
    """The arguments, every one checked (a usage error, one line, exit 2): lists as lists."""
    ap = parser()
    args = ap.parse_args(argv)  # (argparse parses a string default through its type too)
    try:
        check_device(args.device)
    except ValueError as e:
        ap.error(f"argument --device: {e}")
    return args


def preflight(args) -> None:
    """Check, without loading anything heavy, that transformers, the model and test.jsonl are
    there."""
    require_module("transformers", "transformers is not installed", EVALS_EXTRA)
    resolve_model(args.model, args.pretrained, args.gguf_file)
    data_dir(args.gsm8k_dir)


def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        preflight(args)
    except MissingInput as e:
        fail(PROG, e)
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logit_parity.json").write_text(json.dumps(report, indent=2))
    (out / "logit_parity.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
