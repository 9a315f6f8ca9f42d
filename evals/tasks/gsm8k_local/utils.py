"""Data loader of the ``gsm8k_local`` task: GSM8K's train/test JSONL read from a local directory.

The directory comes from (first found): the task metadata key ``gsm8k_dir`` (``lm_eval
--metadata '{"gsm8k_dir": "../shared/data/gsm8k"}'`` or ``TaskManager(metadata=...)``), the
environment variable ``DCP_A2A_GSM8K_DIR`` (the one variable every dcp_a2a command reads:
``dcp-a2a validate`` too), or ``../shared/data/gsm8k`` next to the repository root. No hub is
contacted. The task needs both splits (5-shot examples come from train); the logit-parity
driver reads only the test split and asks only for it.
"""

from __future__ import annotations

import os
from pathlib import Path

from dcp_a2a.evals.inputs import MissingInput

ENV_VAR = "DCP_A2A_GSM8K_DIR"
OLD_ENV_VAR = "DCP_GSM8K_DIR"  # read by earlier versions; named in the error if still set
SPLITS = ("train.jsonl", "test.jsonl")
_REPO = Path(__file__).resolve().parents[3]
DEFAULT_DIR = _REPO.parent / "shared" / "data" / "gsm8k"
# what fixes a missing directory for someone driving lm-eval directly (the drivers pass their
# own --gsm8k-dir advice)
LM_EVAL_FIX = f"""pass --metadata '{{"gsm8k_dir": "DIR"}}' or export {ENV_VAR}=DIR"""


def resolve_dir(gsm8k_dir: str | None = None, need=SPLITS, fix: str | None = None) -> Path:
    """The GSM8K directory holding every file in ``need``; :class:`MissingInput` (naming the
    directory, the missing files and ``fix``) otherwise."""
    d = Path(gsm8k_dir or os.environ.get(ENV_VAR) or DEFAULT_DIR).expanduser()
    missing = [s for s in need if not (d / s).is_file()]
    if missing:
        what = f"GSM8K data not found: {d} has no {', '.join(missing)}"
        if os.environ.get(OLD_ENV_VAR) and not os.environ.get(ENV_VAR):
            what += f" ({OLD_ENV_VAR} is set but no longer read: rename it {ENV_VAR})"
        raise MissingInput(what, fix or LM_EVAL_FIX)
    return d


def load_gsm8k(gsm8k_dir: str | None = None, **_ignored):
    """DatasetDict with ``train`` and ``test`` splits (fields ``question``, ``answer``)."""
    import datasets

    d = resolve_dir(gsm8k_dir)
    return datasets.load_dataset("json", data_files={"train": str(d / "train.jsonl"),
                                                     "test": str(d / "test.jsonl")})
