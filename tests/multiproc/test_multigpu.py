"""The same multi-process checks on NCCL: rank r on cuda:r. Needs >= 2 (some >= 4) GPUs;
skipped with the reason elsewhere. Nothing else in the tier depends on GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dcp_a2a.procpool import RankPool
from tests._data import DTYPES, bits_view, partials
from tests.multiproc.mp_tasks import heads_of
from tests.multiproc.test_lse_reduce_multiproc import masked_partials, run_cases

pytestmark = [pytest.mark.multigpu, pytest.mark.multiproc]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _need(n: int):
    have = _gpus()
    if have < n:
        pytest.skip(f"needs >= {n} CUDA GPUs for an NCCL group of {n}; this machine has {have}")


@pytest.fixture(scope="module")
def nccl_pool():
    _need(2)
    world = 4 if _gpus() >= 4 else 2
    pool = RankPool(world, backend="nccl", subgroup_sizes=(2,) if world == 4 else (),
                    pg_timeout=60.0, task_timeout=120.0)
    yield pool
    pool.close()


@pytest.mark.conformance
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nccl_matches_oracle(nccl_pool, merge_check, impl, n, dtype):
    _need(n)
    cases, data, oracle = [], [], []
    for i, base_e in enumerate((True, False)):
        outs, lses = partials(n, 16, 16 * n, 96, dtype, seed=40 + n + i)
        cases.append(dict(return_lse=True, base_e=base_e, query_start_loc=None, backend=None))
        data.append((outs, lses, None))
        oracle.append(lses)
        outs, lses, oracle_lses, seq_lens, qsl = masked_partials(n, dtype, seed=90 + i, hpr=4,
                                                                 d=72)
        cases.append(dict(return_lse=True, base_e=base_e, query_start_loc=qsl, backend=None))
        data.append((outs, lses, seq_lens))
        oracle.append(oracle_lses)
    results = run_cases(nccl_pool, n, cases, data)
    for r in range(n):
        for case, (outs, _, _), o_lses, res in zip(cases, data, oracle, results[r]):
            assert res["inputs_intact"]
            merge_check(res["out"], res["lse"], outs, o_lses, is_lse_base_on_e=case["base_e"],
                        heads=heads_of(r, n, outs.shape[2]))


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
           f"--nproc-per-node={nproc}", "-m", "dcp_a2a.accuracy", "--dist-backend", "nccl",
           "--shapes", "1x128x512,16x128x512,128x128x512,1024x64x512:bfloat16",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["meta"]["dist_backend"] == "nccl"
    assert report["meta"]["world_size"] == nproc
