"""lm-eval model ``dcp-hf``: lm-eval's HF model with DCP attention (evals/dcp_attention.py).

    python -m dcp_a2a.evals.lm_eval_model --model dcp-hf \\
        --model_args model=qwen2.5-coder-1.5b,dcp_size=4,backend=packed,lse_base=e \\
        --tasks gsm8k_local --batch_size 8 \\
        --metadata '{"gsm8k_dir": "../shared/data/gsm8k"}'

The options are lm-eval's (its ``run`` subcommand), given flat as above; ``--help`` lists them
after the model arguments below.

lm-eval registers models by import (it has no plugin entry points), so this module is the
``lm_eval`` CLI with ``dcp-hf`` registered (and the ``gsm8k_local`` task directory added to
``--include_path`` when none is given); from Python, import it before
``lm_eval.simple_evaluate(model="dcp-hf", ...)``. Prepare a registered model first:
``python -m dcp_a2a.evals.prepare --model NAME``.

dcp-hf model_args (on top of HFLM's; ``backend`` is the DCP combine backend, HFLM's own
causal/seq2seq switch is ``hf_backend``):
  model       registered model: smollm2 (default) | qwen2.5-coder-0.5b |
              qwen2.5-coder-1.5b (see evals/registry.py)
  pretrained  an HF model directory or id instead (gguf_file=NAME for a GGUF inside it)
  dtype       float32 (default) | bfloat16 | float16 | float64 | auto
  device      cuda if available, else cpu (lm-eval's --device; cuda falls back to cpu
              where CUDA is not available)
  dcp_size    N simulated ranks (default 3)
  backend     reference (the unsharded model, SDPA) | packed | two_collective | ag_rs
              (default packed)
  lse_base    e (default) | 2
  combine     auto (default: Triton on CUDA, the reference wire path on CPU) | triton |
              reference
  shard       decode (default: DCP on decode steps, prefill unsharded) | all
  interleave  KV interleave size (default 1 = token interleave)
  wire_dtype  dtype of the partials on the wire (default: the model dtype; float64 models
              need float32)
  kv_cache    preallocated (default: one buffer per layer for the prompt and every new token,
              written in place) | dynamic (transformers' DynamicCache, which copies the whole
              cache at every step); the same generations (tests/e2e/test_fast_path.py)
The model is loaded once by evals/model.py (the loader the logit-parity driver uses) and handed
to HFLM; HFLM's loading options (revision, parallelize, ...) do not apply. Multi-process DCP
(a real process group) is driven by ``python -m dcp_a2a.evals.gsm8k --distributed`` under
torchrun, not by this CLI: lm-eval's own multi-process mode splits the questions over the
ranks, which is data parallelism, not DCP.
"""

from __future__ import annotations

import sys
import warnings

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from .dcp_attention import BACKENDS, DCPSettings, attach_dcp, detach_dcp
from .model import load_model, parse_dtype, resolve_model

DCP_BACKENDS = ("reference",) + BACKENDS  # reference: unsharded SDPA
KV_CACHES = ("preallocated", "dynamic")


@register_model("dcp-hf")
class DCPHFLM(HFLM):
    """HFLM over a model loaded by :func:`evals.model.load_model` whose attention runs DCP
    (any backend but ``reference``). :meth:`set_backend` switches the backend of the loaded
    model, so a driver loads it once for all backends.

    ``dcp_rank``: a :class:`evals.distributed.RankContext` (Python only, set by the GSM8K
    driver under torchrun): this process is one rank of a real DCP group; every generate call
    runs in lockstep with the other ranks (evals/distributed.py)."""

    def __init__(self, pretrained=None, model=None, gguf_file=None, dtype="float32",
                 device=None, dcp_size=3, backend="packed", lse_base="e", combine="auto",
                 shard="decode", interleave=1, wire_dtype=None, kv_cache="preallocated",
                 hf_backend="causal", dcp_rank=None, **kwargs):
        if backend not in DCP_BACKENDS:
            raise ValueError(f"unknown DCP backend {backend!r}: expected one of "
                             f"{', '.join(DCP_BACKENDS)}")
        if kv_cache not in KV_CACHES:
            raise ValueError(f"unknown kv_cache {kv_cache!r}: expected one of "
                             f"{', '.join(KV_CACHES)}")
        self.kv_cache = kv_cache
        resolved = resolve_model(model, pretrained, gguf_file)
        if dcp_rank is not None:
            device = dcp_rank.device
        elif str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's CLI passes --device cuda unless told otherwise
            print(f"dcp-hf: device {device} requested but CUDA is not available: using cpu",
                  file=sys.stderr)
            device = "cpu"
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        m, tok = load_model(resolved["pretrained"], resolved["gguf_file"], dtype=dtype,
                            device=device)
        super().__init__(pretrained=m, tokenizer=tok, backend=hf_backend, **kwargs)
        self.model_label = resolved["model"]
        self.dcp_rank = dcp_rank
        self.dcp_size = dcp_rank.world_size if dcp_rank is not None else int(dcp_size)
        self._dcp_kw = {"lse_base": str(lse_base), "combine": str(combine),
                        "shard": str(shard), "interleave": int(interleave),
                        "wire_dtype": parse_dtype(wire_dtype) if wire_dtype else None}
        self.dcp_backend = None
        self.dcp_settings = None
        self.set_backend(backend)

    def set_backend(self, backend: str) -> None:
        """Run the loaded model with ``backend`` from the next call on (``reference``: SDPA,
        no DCP)."""
        if backend not in DCP_BACKENDS:
            raise ValueError(f"unknown DCP backend {backend!r}: expected one of "
                             f"{', '.join(DCP_BACKENDS)}")
        self.dcp_backend = backend
        if backend == "reference":
            detach_dcp(self.model)
            self.dcp_settings = None
            return
        group = self.dcp_rank.group if self.dcp_rank is not None else None
        self.dcp_settings = DCPSettings(world_size=self.dcp_size, backend=backend,
                                        group=group, **self._dcp_kw)
        attach_dcp(self.model, self.dcp_settings)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        if self.dcp_rank is not None:
            from .distributed import lead_generate

            return lead_generate(self, context, max_length, stop, generation_kwargs)
        if self.kv_cache == "preallocated":
            from .kv_cache import PreallocatedCache

            # max_length: the padded prompt and every new token; the cache never grows
            cache = PreallocatedCache(self.model.config, max_length)
            if cache is not None:
                generation_kwargs["past_key_values"] = cache
        with warnings.catch_warnings():
            # newer transformers name it cache= and warn on past_key_values=, which every
            # version this project supports still takes
            warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated",
                                    category=FutureWarning)
            return super()._model_generate(context, max_length, stop, **generation_kwargs)


def run_parser():
    """lm-eval's evaluation parser (its ``run`` subcommand; an older lm-eval has only that
    flat CLI), presented as this command: the options are given flat, with no subcommand
    (lm-eval inserts ``run`` itself when the first argument is an option)."""
    import argparse

    try:
        from lm_eval._cli.run import Run
    except ImportError:  # the flat CLI of older lm-eval
        from lm_eval.__main__ import setup_parser

        ap = setup_parser()
    else:
        subs = argparse.ArgumentParser(prog=PROG).add_subparsers()
        Run.create(subs)
        ap = subs.choices["run"]
    ap.prog = PROG
    ap.usage = (f"{PROG} --model dcp-hf --model_args <key=value,...> --tasks <task> "
                "[options]")
    ap.description = "Evaluate dcp-hf (or any lm-eval model) on lm-eval tasks."
    ap.epilog = "example:\n  " + EXAMPLE
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    return ap


def help_text() -> str:
    """``--help``: the dcp-hf model_args (this module's docstring), then the options."""
    return __doc__ + "\n" + "-" * 30 + " options " + "-" * 30 + "\n" + run_parser().format_help()


def main(argv=None) -> None:
    """The lm_eval CLI with dcp-hf registered, flat (``--help``: :func:`help_text`)."""
    from pathlib import Path

    from lm_eval.__main__ import cli_evaluate

    from .inputs import MissingInput, fail, quiet_git

    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(help_text(), flush=True)
        raise SystemExit(0)
    if "--tasks" in args and "--include_path" not in args:
        args += ["--include_path", str(Path(__file__).resolve().parent / "tasks")]
    try:  # an unprepared or unknown model or missing data fails here, in one line, before lm-eval
        _preflight(args)
    except (MissingInput, ValueError) as e:
        fail(PROG, e)
    sys.argv = [sys.argv[0], *args]
    try:
        with quiet_git():
            cli_evaluate()
    except MissingInput as e:  # e.g. the GSM8K directory, found missing by the task loader
        fail(PROG, e)


PROG = "python -m dcp_a2a.evals.lm_eval_model"
EXAMPLE = (PROG + " --model dcp-hf --model_args model=qwen2.5-coder-1.5b,dcp_size=4,"
           "backend=packed,lse_base=e --tasks gsm8k_local --batch_size 8 --metadata "
           "'{\"gsm8k_dir\": \"../shared/data/gsm8k\"}'")


def _value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def _preflight(args: list[str]) -> None:
    """resolve_model on ``--model_args`` of a dcp-hf run (comma-separated key=value), and the
    GSM8K directory (``--metadata``'s gsm8k_dir) of a gsm8k_local run."""
    import json

    from .tasks.gsm8k_local.utils import resolve_dir

    if _value(args, "--model") == "dcp-hf":
        raw = _value(args, "--model_args") or ""
        kv = dict(x.split("=", 1) for x in raw.split(",") if "=" in x)
        resolve_model(kv.get("model"), kv.get("pretrained"), kv.get("gguf_file"))
    if "gsm8k_local" in (_value(args, "--tasks") or "").split(","):
        try:
            meta = json.loads(_value(args, "--metadata") or "{}")
        except ValueError:
            meta = {}  # lm-eval reports a malformed --metadata itself
        resolve_dir(meta.get("gsm8k_dir") if isinstance(meta, dict) else None)


if __name__ == "__main__":
    main()
