"""The same multi-process checks on NCCL: rank r on cuda:r. Needs >= 2 (some >= 4) GPUs;
skipped with the reason elsewhere. Nothing else in the tier depends on GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dcp_a2a.testing.childenv import child_env
from dcp_a2a.testing.plugin import need_gpus as _need
from dcp_a2a.testing.data import bits_view, partials
from dcp_a2a.testing.data import heads_of
from dcp_a2a.testing.groups import run_cases

pytestmark = [pytest.mark.multigpu, pytest.mark.multiproc]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("n", [2, 4])
def test_nccl_backends_bitwise_and_bounds(nccl_pool, merge_check, project_only, n):
    _need(n)
    backends = ("packed", "two_collective", "ag_rs")
    outs, lses = partials(n, 64, 8 * n, 512, torch.bfloat16, seed=7 * n)
    cases = [dict(return_lse=True, base_e=False, query_start_loc=None, backend=be)
             for be in backends]
    results = run_cases(nccl_pool, n, cases, [(outs, lses, None)] * 3)
    for r in range(n):
        p, t, a = results[r]
        assert torch.equal(bits_view(p["out"]), bits_view(t["out"]))
        assert torch.equal(bits_view(p["lse"]), bits_view(t["lse"]))
        for res, kind in ((p, "a2a"), (a, "ag_rs")):
            merge_check(res["out"], res["lse"], outs, lses, is_lse_base_on_e=False, kind=kind,
                        heads=heads_of(r, n, outs.shape[2]))


@pytest.mark.parametrize("nproc", [2, 4])
def test_torchrun_nccl_accuracy_job(tmp_path, impl, nproc):
    _need(nproc)
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "dcp_a2a.testing.accuracy", "--dist-backend", "nccl",
           "--shapes", "1x128x512,16x128x512,128x128x512,1024x64x512:bfloat16",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=child_env(ROOT))  # the caller's PYTHONPATH kept: --impl's module
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["meta"]["dist_backend"] == "nccl"
    assert report["meta"]["world_size"] == nproc
