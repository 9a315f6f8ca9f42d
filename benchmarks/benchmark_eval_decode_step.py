"""Time the decode step of the evals' simulated-DCP model, per backend: where a GSM8K run spends
its time, measured without lm-eval (one prefill, then greedy steps of the model's forward).

    python benchmarks/benchmark_eval_decode_step.py --model smollm2 --batch-size 8 \\
        --context 900 --steps 16
    python benchmarks/benchmark_eval_decode_step.py --model qwen2.5-coder-1.5b \\
        --dtype bfloat16 --batch-size 256 --context 900 --steps 32 --profile 2

The prompt is ``--batch-size`` rows of ``--context`` random tokens (no padding); it is
prefilled once (SDPA, unsharded: what ``shard=decode`` does) and each configuration starts
from a copy of that cache, so every configuration decodes the same steps. Per backend: the
median wall and process-CPU milliseconds of a decode step, with the KV cache ``--kv-cache``
(the evals' preallocated cache, or transformers' DynamicCache). ``--profile K`` prints
torch.profiler's top operators over K steps of each configuration (CPU and, on a GPU, CUDA
time). Writes ``decode_step.json`` (the rows, and the run: card, commit, command) and
``decode_step.md`` (what it printed) under ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)

import torch

from dcp_a2a.evals.inputs import (ArgumentParser, HelpFormatter, MissingInput, check_device,
                                  check_out_dir, comma_list, fail, positive_int, require_module)
from dcp_a2a.evals.model import EVALS_EXTRA, add_model_arguments, dtype_arg, resolve_model

import _run

PROG = "python benchmarks/benchmark_eval_decode_step.py"
BACKENDS = ("reference", "packed", "two_collective", "ag_rs")


def _cache_from(model, snapshot, kind: str, capacity: int):
    """A fresh cache holding the prefilled keys/values ``snapshot`` ([(k, v)] per layer)."""
    from transformers import DynamicCache

    from dcp_a2a.evals.kv_cache import PreallocatedCache

    cache = PreallocatedCache(model.config, capacity) if kind == "preallocated" else None
    if cache is None:
        cache = DynamicCache(config=model.config)
    for i, (k, v) in enumerate(snapshot):
        cache.update(k.clone(), v.clone(), i)
    return cache


def _steps(model, cache, first, mask, steps: int, sync, profile: int = 0):
    """(wall ms of each step, process CPU ms of each step, greedy tokens [B, steps],
    profiler or None)."""
    nxt, wall, cpu, toks, prof = first, [], [], [], None
    for s in range(steps):
        if profile and s == steps - profile:
            from torch.profiler import ProfilerActivity, profile as torch_profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                             if torch.cuda.is_available() else [])
            prof = torch_profile(activities=acts)
            prof.__enter__()
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        logits = model(input_ids=nxt, attention_mask=mask, past_key_values=cache,
                       use_cache=True).logits
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        sync()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
        toks.append(nxt)
    if prof is not None:
        prof.__exit__(None, None, None)
    return wall, cpu, torch.cat(toks, dim=1).cpu(), prof


def run(args) -> dict:
    from transformers import DynamicCache

    from dcp_a2a.evals import dcp_attention as da
    from dcp_a2a.evals.model import load_model

    import warnings

    # newer transformers name it cache= and warn on past_key_values=, which all still take
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated",
                            category=FutureWarning)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    model, _ = load_model(args.pretrained, args.gguf_file, dtype=args.dtype, device=dev,
                          model=args.model)
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (args.batch_size, args.context), generator=g).to(dev)
    mask = torch.ones_like(ids)
    torch.set_grad_enabled(False)
    cache = DynamicCache(config=model.config)
    sync()
    t0 = time.perf_counter()
    first = model(input_ids=ids, attention_mask=mask, past_key_values=cache,
                  use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
    sync()
    prefill_s = time.perf_counter() - t0
    snapshot = [(layer.keys, layer.values) for layer in cache.layers]
    del cache
    capacity = args.context + args.steps + 1
    rows = []
    for backend in args.backends:
        if backend == "reference":
            da.detach_dcp(model)
        else:
            da.attach_dcp(model, da.DCPSettings(world_size=args.dcp_size, backend=backend,
                                                lse_base=args.lse_base, combine=args.combine))
        wall_ms, cpu_ms, prof = [], [], None
        for rnd in range(args.rounds):
            c = _cache_from(model, snapshot, args.kv_cache, capacity)
            wall, cpu, _, p = _steps(model, c, first, mask, args.steps, sync,
                                     args.profile if rnd == 0 else 0)
            del c
            wall_ms += wall[1:]  # the first step pays one-off allocations
            cpu_ms += cpu[1:]
            prof = prof or p
        da.detach_dcp(model)
        row = {"backend": backend, "kv_cache": args.kv_cache, "steps": len(wall_ms),
               "median_ms": statistics.median(wall_ms), "mean_ms": statistics.fmean(wall_ms),
               "median_cpu_ms": statistics.median(cpu_ms)}
        rows.append(row)
        print(f"{backend:15s} ({args.kv_cache:12s}): {row['median_ms']:8.1f} ms/step median "
              f"wall, {row['median_cpu_ms']:8.1f} ms CPU", flush=True)
        if prof is not None:
            key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
            print(prof.key_averages().table(sort_by=key, row_limit=15), flush=True)
    cfg = {k: ",".join(v) if isinstance(v, list) else v for k, v in vars(args).items()}
    return {"config": cfg, "device_name": (torch.cuda.get_device_name(dev)
                                            if dev.startswith("cuda") else "cpu"),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "load_s": load_s, "prefill_s": prefill_s, "rows": rows}


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--backends", default="reference,packed,two_collective,ag_rs",
                    type=comma_list(BACKENDS, "backend"), help="comma-separated")
    ap.add_argument("--batch-size", type=positive_int, default=8, help="rows decoded at once")
    ap.add_argument("--context", type=positive_int, default=900,
                    help="prompt tokens per row (a 5-shot GSM8K prompt is ~700-900)")
    ap.add_argument("--steps", type=positive_int, default=16, help="decode steps timed")
    ap.add_argument("--dcp-size", type=positive_int, default=4, help="simulated DCP ranks N")
    ap.add_argument("--lse-base", default="e", choices=("e", "2"), help="LSE base")
    ap.add_argument("--combine", default="auto", choices=("auto", "triton", "reference"),
                    help="auto = Triton on CUDA, the reference wire path on the CPU")
    ap.add_argument("--dtype", default="float32", type=dtype_arg, help="model dtype")
    ap.add_argument("--kv-cache", default="preallocated", choices=("preallocated", "dynamic"),
                    help="the KV cache the steps run with")
    ap.add_argument("--rounds", type=positive_int, default=2,
                    help="rounds of --steps per configuration (steps after a round's first "
                         "are timed)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: torch's default); 1 makes the CPU time per "
                         "step a steadier measure on a shared machine")
    ap.add_argument("--profile", type=int, default=0,
                    help="print torch.profiler's top operators over the last K steps")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device")
    add_model_arguments(ap)
    ap.add_argument("--out", default="out/decode_step", help="output directory")
    return ap


def main(argv=None) -> dict:
    ap = parser()
    args = ap.parse_args(argv)
    try:
        check_device(args.device)
    except ValueError as e:
        ap.error(f"argument --device: {e}")
    if not 0 <= args.profile <= args.steps:
        ap.error(f"argument --profile: expected 0 to --steps ({args.steps}), got {args.profile}")
    check_out_dir(ap, args.out)
    try:
        require_module("transformers", "transformers is not installed", EVALS_EXTRA)
        resolve_model(args.model, args.pretrained, args.gguf_file)
    except MissingInput as e:
        fail(PROG, e)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with _run.recorded(out / "decode_step.json", "eval_decode_step") as save:
        report = run(args)
        save(report)
    return report


if __name__ == "__main__":
    main()
