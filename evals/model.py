"""The one loader every eval uses: a registered model (evals/registry.py), from its
dequantised copy when there is one for this transformers (evals/dequantised.py), else from its
GGUF, or any HF model directory or id (``--pretrained``, with ``--gguf-file`` for a GGUF inside a
directory); and the model options every driver takes.

transformers dequantises the GGUF tensors to the requested dtype (``gguf`` must be installed) and
builds the tokenizer from the GGUF metadata.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from . import dequantised
from .inputs import MissingInput
# the registry's names, for the drivers and callers that import them from the loader
from .registry import (BY_STRENGTH, CACHE_ENV, DEFAULT_MODEL, EVALS_EXTRA,  # noqa: F401
                       MODELS, ModelSpec, cache_dir, cached_path, find_gguf, get_spec,
                       installed_pieces, prepared_models, require_gguf, stamp_path,
                       strongest_prepared_model)


def _looks_like_hub_id(s: str) -> bool:
    return (s.count("/") == 1 and not s.startswith((".", "/", "~"))
            and not s.endswith("/") and not Path(s).exists())


def resolve_model(model: str | None = None, pretrained: str | None = None,
                  gguf_file: str | None = None) -> dict:
    """``{"pretrained": dir-or-id, "gguf_file": name-or-None, "model": label}`` for the loader,
    checked before anything heavy is imported.

    ``pretrained`` (a directory, or an HF hub id) wins over ``model`` (a registry name, default
    :data:`DEFAULT_MODEL`). A registered model loads from its dequantised copy when one is
    there for this transformers (:mod:`evals.dequantised`: the same tensors, in seconds), else
    from the GGUF. Raises :class:`MissingInput` for an unprepared model, a missing
    directory or GGUF file, or a GGUF without the ``gguf`` package; ``ValueError`` for an
    unknown model name."""
    if pretrained:
        if not _looks_like_hub_id(pretrained):
            p = Path(pretrained).expanduser()
            if not p.exists():
                raise MissingInput(f"--pretrained {pretrained} does not exist",
                                   "pass an existing model directory, or --model NAME after "
                                   "python -m dcp_a2a.evals.prepare --model NAME")
            if gguf_file and not (p / gguf_file).is_file():
                raise MissingInput(f"GGUF file {gguf_file} not found in {p}",
                                   "pass the name of a .gguf file inside --pretrained")
        out = {"pretrained": str(pretrained), "gguf_file": gguf_file, "model": str(pretrained)}
    else:
        name = model or DEFAULT_MODEL
        p = require_gguf(name)
        d = dequantised.find(get_spec(name))
        out = ({"pretrained": str(d), "gguf_file": None, "model": name} if d else
               {"pretrained": str(p.parent), "gguf_file": p.name, "model": name})
    if out["gguf_file"] and importlib.util.find_spec("gguf") is None:
        raise MissingInput("the Python package gguf is not installed (transformers needs it to "
                           "read GGUF models)", EVALS_EXTRA)
    return out


DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "float64", "fp64")


def dtype_arg(value: str) -> str:
    """argparse type of a model dtype: a name :func:`parse_dtype` takes, or auto."""
    import argparse

    if value not in DTYPE_NAMES + ("auto",):
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(DTYPE_NAMES)} or auto, "
                                         f"got {value!r}")
    return value


def parse_dtype(name):
    """A torch dtype from its name (``"auto"``: the checkpoint's own)."""
    import torch

    if isinstance(name, torch.dtype) or name == "auto":
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float64": torch.float64, "fp64": torch.float64}
    try:
        return table[str(name)]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(table)} or auto"
                         ) from None


def load_model(pretrained: str | None = None, gguf_file: str | None = None,
               dtype="float32", device: str = "cpu", model: str | None = None):
    """(model, tokenizer) in eval mode with SDPA attention (attach DCP with
    :func:`evals.dcp_attention.attach_dcp`). Resolves its arguments with
    :func:`resolve_model` (default: the registry's default model)."""
    from transformers import AutoModelForCausalLM

    r = resolve_model(model, pretrained, gguf_file)
    tok = _tokenizer(r)
    m = AutoModelForCausalLM.from_pretrained(r["pretrained"], dtype=parse_dtype(dtype),
                                             attn_implementation="sdpa", **_gguf(r))
    return m.to(device).eval(), tok


def load_tokenizer(pretrained: str | None = None, gguf_file: str | None = None,
                   model: str | None = None):
    """The tokenizer alone (arguments as :func:`resolve_model`'s): what comparing two runs'
    generations token by token needs, without loading the model."""
    return _tokenizer(resolve_model(model, pretrained, gguf_file))


def _tokenizer(r: dict):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(r["pretrained"], **_gguf(r))


def _gguf(r: dict) -> dict:
    """from_pretrained's GGUF argument for a :func:`resolve_model` result (none for a directory)."""
    return {"gguf_file": r["gguf_file"]} if r["gguf_file"] else {}


def add_model_arguments(ap) -> None:
    """The model options every eval command takes: --model, --pretrained, --gguf-file."""
    ap.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS),
                    help="registered model (ignored with --pretrained); prepare it with python "
                         "-m dcp_a2a.evals.prepare --model NAME")
    ap.add_argument("--pretrained", default=None,
                    help="an HF model directory or id instead of --model")
    ap.add_argument("--gguf-file", default=None,
                    help="with --pretrained DIR: the name of a GGUF file in DIR")
