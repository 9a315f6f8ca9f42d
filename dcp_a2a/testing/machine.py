"""What this machine is and has, as ``dcp-a2a validate`` plans by it and its report says it:
the GPUs, torch and Triton, the process-group backends, the eval model and the GSM8K data, the
modules the tiers need, the checkout's commit."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path

PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the directory holding dcp_a2a/
REPO_ROOT = PACKAGE_PARENT                             # ... which is the checkout, if any
GSM8K_ENV = "DCP_A2A_GSM8K_DIR"


def default_gsm8k_dir() -> Path:
    env = os.environ.get(GSM8K_ENV)
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "data" / "gsm8k")


def prepared_eval_models() -> list[tuple[str, Path]]:
    """[(name, GGUF path)] of the registered eval models that ``python -m
    dcp_a2a.evals.prepare`` has prepared here, strongest first; found without loading any."""
    try:
        from dcp_a2a.evals import model as em
    except ImportError:
        return []
    return em.prepared_models()


def find_eval_model(name: str | None = None) -> tuple[str | None, Path | None]:
    """(name, GGUF) of the eval model: ``name`` if given (its GGUF, or None when it is not
    prepared), else the strongest prepared one (None, None when there is none)."""
    prepared = prepared_eval_models()
    if name is None:
        return prepared[0] if prepared else (None, None)
    return name, dict(prepared).get(name)


def module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _git_commit() -> str | None:
    if os.environ.get("DCP_A2A_COMMIT"):  # a copy of a checkout without its own history
        return os.environ["DCP_A2A_COMMIT"][:7]
    if not (REPO_ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def detect_machine(gsm8k_dir: Path | None = None, eval_model: str | None = None) -> dict:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except Exception as e:  # noqa: BLE001 - report, don't die
        triton_version = f"unavailable ({type(e).__name__})"
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = []
    for i in range(n_gpu):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                     "capability": f"{p.major}.{p.minor}"})
    dist = {"available": torch.distributed.is_available()}
    if dist["available"]:
        dist["gloo"] = torch.distributed.is_gloo_available()
        dist["nccl"] = torch.distributed.is_nccl_available()
    gsm8k_dir = Path(gsm8k_dir) if gsm8k_dir else default_gsm8k_dir()
    model_name, model = find_eval_model(eval_model)
    interp = os.environ.get("TRITON_INTERPRET", "")
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "TRITON_INTERPRET": interp or None,
        "triton_mode": "interpreter" if interp not in ("", "0") else "compiled",
        "cuda_device_count": n_gpu,
        "gpus": gpus,
        "device": gpus[0]["name"] if gpus else "cpu",
        "distributed": dist,
        "eval_model": str(model) if model else None,
        "eval_model_name": model_name,
        "gsm8k_dir": str(gsm8k_dir),
        "gsm8k_present": (gsm8k_dir / "test.jsonl").is_file(),
        "modules": {m: module_present(m) for m in (
            "xdist", "matplotlib", "transformers", "gguf", "accelerate", "lm_eval",
            "dcp_a2a.evals.logit_parity", "dcp_a2a.evals.gsm8k")},
        "git_commit": _git_commit(),
    }

