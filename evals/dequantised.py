"""A prepared GGUF model dequantised once, to float32 safetensors, so that a run loads it in
seconds: transformers dequantises every tensor of a GGUF on the CPU at every load (the 1.5B:
51 s in bfloat16, 89 s in float32 on the 2-core CPU; 2 s and 0.1 s from this copy).

    python -m dcp_a2a.evals.prepare --model NAME --dequantise      (after prepare or --join)

``<cache>/<model>/dequantised/`` holds ``model.safetensors`` (every tensor of the model as
transformers loads the GGUF in float32), ``config.json`` (that model's config without its GGUF
quantisation entry), ``generation_config.json`` and the tokenizer's files, and last
``dequantised.json``: the GGUF's SHA-256, the transformers version that read it and the format.
The copy is written under a temporary name, loaded back and compared with the model and
tokenizer it came from -- every tensor bit for bit, the configs, the generation config, the
special tokens, the chat template and the token ids of a probe text -- and only then renamed
and stamped. A lower dtype loads from it exactly as from the GGUF (transformers dequantises to
float32 and casts either way; checked for the 1.5B in bfloat16 too, docs/evals.md).

:func:`find` gives the directory only while its stamp names the registry's SHA-256 and the
transformers installed now; :func:`evals.model.resolve_model` then loads a registered model
from it, else from the GGUF (another transformers may dequantise differently). :func:`export`
is handed the loader that reads the GGUF (``evals.model.load_model``), so this module needs the
registry only.
"""

from __future__ import annotations

import json
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .inputs import MissingInput
from .registry import ModelSpec, cached_path, find_gguf

DIR_NAME = "dequantised"
STAMP = "dequantised.json"
FORMAT = "dcp_a2a.evals dequantised 1"
# Config entries that differ between the GGUF-loaded model and the copy by construction.
_CONFIG_SKIP = ("quantization_config", "_name_or_path", "transformers_version")
_PROBE = ("Question: Janet's ducks lay 16 eggs per day. She eats 3, bakes with 4 and sells the "
          "rest at $2.50 each, 1,234.5 in all?\nAnswer: 16 - 3 - 4 = <<16-3-4=9>>9\n#### 9\n"
          "<|im_start|>user\n\u00e9\u4e2d\u6587 \U0001F600<|im_end|>\n")


class DequantiseError(MissingInput):
    """The copy did not match the model it was made from (nothing is kept)."""


def path(spec: ModelSpec, root: Path | None = None) -> Path:
    return cached_path(spec, root).parent / DIR_NAME


def _transformers_version() -> str | None:
    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def _stamp(spec: ModelSpec) -> dict:
    """What a copy made of ``spec`` by this transformers is stamped with (and found by)."""
    return {"format": FORMAT, "gguf_sha256": spec.sha256, "transformers": _transformers_version()}


def find(spec: ModelSpec, root: Path | None = None) -> Path | None:
    """The dequantised copy of ``spec`` when its stamp matches the registry's SHA-256 and the
    transformers installed now, else None. Reads one small file (no transformers import)."""
    d = path(spec, root)
    try:
        stamp = json.loads((d / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return d if all(stamp.get(k) == v for k, v in _stamp(spec).items()) else None


def _config_dict(config) -> dict:
    return {k: v for k, v in config.to_dict().items() if k not in _CONFIG_SKIP}


def _tokenizer_view(tok) -> dict:
    return {"ids": tok(_PROBE)["input_ids"], "special": tok.special_tokens_map,
            "chat_template": tok.chat_template, "padding_side": tok.padding_side}


def _compare(model, tok, other, other_tok) -> str | None:
    """What differs between the source model/tokenizer and the copy loaded back, or None."""
    import torch

    a, b = model.state_dict(), other.state_dict()
    if set(a) != set(b):
        return f"tensor names differ: {sorted(set(a) ^ set(b))[:4]}"
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k]):
            return f"tensor {k} differs"
    if _config_dict(model.config) != _config_dict(other.config):
        return "the model configs differ"
    ga, gb = (_config_dict(m.generation_config) for m in (model, other))
    if ga != gb:
        return "the generation configs differ"
    if _tokenizer_view(tok) != _tokenizer_view(other_tok):
        return "the tokenizers differ (probe ids, special tokens, chat template or padding)"
    return None


def export(spec: ModelSpec, load_model, root: Path | None = None, log=print) -> Path:
    """Write, check and stamp the dequantised copy of the prepared ``spec``; returns its path.
    ``load_model(pretrained, gguf_file, dtype=...)`` gives (model, tokenizer) from the GGUF
    (``evals.model.load_model``). Raises MissingInput when the GGUF is not prepared,
    DequantiseError when the copy read back differs."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf(spec, root)
    if gguf is None:
        raise MissingInput(f"model {spec.name} is not prepared in {cached_path(spec, root).parent}",
                           spec.prepare_command)
    d = path(spec, root)
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with torch.no_grad():
        model, tok = load_model(str(gguf.parent), gguf.name, dtype="float32")
        # transformers' own save refuses a GGUF-loaded model. A tied tensor (the same storage
        # under two names, which safetensors refuses) is written under its first name: the
        # config's tie restores the other on load, and the comparison below checks it did.
        tensors, seen = {}, set()
        for k, v in model.state_dict().items():
            if v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                tensors[k] = v.contiguous()
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads(model.config.to_json_string(use_diff=False))
        cfg.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        back = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                    attn_implementation="sdpa").eval()
        problem = _compare(model, tok, back, AutoTokenizer.from_pretrained(tmp))
    if problem:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DequantiseError(f"{spec.name}: the dequantised copy does not match the GGUF-loaded "
                              f"model: {problem}; nothing kept",
                              "load from the GGUF (the default without a copy)")
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)
    (d / STAMP).write_text(json.dumps(_stamp(spec), indent=1) + "\n")
    log(f"{spec.name}: dequantised to float32 in {d} ({len(tensors)} tensors written, "
        f"bitwise equal read back)")
    return d
