"""Data loader of the ``gsm8k_local`` task: GSM8K's train/test JSONL read from a local directory.

The directory comes from (first found): the task metadata key ``gsm8k_dir`` (``lm_eval
--metadata '{"gsm8k_dir": "../shared/data/gsm8k"}'`` or ``TaskManager(metadata=...)``), the
environment variable ``DCP_GSM8K_DIR``, or ``../shared/data/gsm8k`` relative to the repository
root. No hub is contacted.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "DCP_GSM8K_DIR"
_REPO = Path(__file__).resolve().parents[3]
DEFAULT_DIR = _REPO.parent / "shared" / "data" / "gsm8k"


def resolve_dir(gsm8k_dir: str | None = None) -> Path:
    d = Path(gsm8k_dir or os.environ.get(ENV_VAR) or DEFAULT_DIR)
    missing = [s for s in ("train.jsonl", "test.jsonl") if not (d / s).is_file()]
    if missing:
        raise FileNotFoundError(
            f"GSM8K JSONL not found in {d} (missing {', '.join(missing)}): pass "
            f"--metadata '{{\"gsm8k_dir\": \"DIR\"}}' or set {ENV_VAR}")
    return d


def load_gsm8k(gsm8k_dir: str | None = None, **_ignored):
    """DatasetDict with ``train`` and ``test`` splits (fields ``question``, ``answer``)."""
    import datasets

    d = resolve_dir(gsm8k_dir)
    return datasets.load_dataset("json", data_files={"train": str(d / "train.jsonl"),
                                                     "test": str(d / "test.jsonl")})
