"""The end-to-end collective benchmark's code path under torchrun (gloo, CPU: the times mean
nothing here; on GPUs the same command times NCCL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
ROOT = str(Path(__file__).resolve().parents[2])


def test_collective_bench_runs_under_torchrun(tmp_path, project_only):
    out = tmp_path / "coll.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "-m", "dcp_a2a.bench", "--collective", "--shapes", "2x4", "--head-dim", "6",
           "--iters", "2", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert report["world_size"] == 2 and (row["B"], row["H"], row["N"]) == (2, 4, 2)
    for backend in ("packed", "two_collective", "ag_rs"):
        assert row[f"{backend}_us"] > 0
