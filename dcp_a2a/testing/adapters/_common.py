"""What the engine adapters share: choosing a variant, finding the installed engine, naming a
release, refusing a variant this machine cannot run."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from pathlib import Path


def pick_variant(engine: str, variant: str | None, variants: dict) -> str:
    """``variant`` (None: the first of ``variants``, the default), or ValueError naming the
    variants there are."""
    if variant is None:
        return next(iter(variants))
    if variant not in variants:
        raise ValueError(f"{engine} has no variant {variant!r} (variants: "
                         f"{', '.join(variants)})")
    return variant


def refuse_release(spec: str, source, why: str) -> None:
    """ValueError where a release (``source``) is given for ``spec``, a variant that runs only
    on the installed engine because ``why``."""
    if source is not None:
        raise ValueError(f"{spec} has no release form: {why} (use --impl {spec} with the engine "
                         "installed)")


def installed_version(dist_name: str) -> str:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def installed_root(package: str, pretty: str, get: str) -> Path:
    """The directory of the installed ``package``; ImportError saying how to get it else."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{pretty} is not installed in this environment (install it, or pass "
                          f"its release: --impl {package}=WHEEL, {get})")
    return Path(next(iter(spec.submodule_search_locations)))


def import_names(module: str, names, pretty: str, follows: str):
    """The installed ``module``, with every one of ``names``; ImportError naming what lacks
    (the adapter reads any other name it can use with ``getattr``)."""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"the installed {pretty} has no {module} ({e}); the adapter follows "
                          f"{follows}") from e
    missing = [n for n in names if not hasattr(mod, n)]
    if missing:
        raise ImportError(f"the installed {pretty}'s {module} defines no {', '.join(missing)} "
                          f"(the adapter follows {follows})")
    return mod


def cuda_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_gpus(spec: str, count: int, what: str) -> None:
    """ValueError, in one line, where this machine has fewer than ``count`` CUDA GPUs."""
    have = cuda_gpus()
    if have < count:
        raise ValueError(f"{spec} needs {count} or more CUDA GPUs with NCCL ({what}); this "
                         f"machine has {have or 'none'}")
