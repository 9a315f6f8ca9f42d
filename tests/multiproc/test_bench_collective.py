"""The end-to-end collective benchmark (``dcp_a2a.testing.bench --collective``) on 2 gloo ranks (CPU:
the times mean nothing here; on GPUs the same command times NCCL under torchrun).

The ranks come from a pool of their own and start the benchmark the way torchrun starts it
(rank, world size and rendezvous store in torchrun's environment variables; the benchmark
creates the default process group itself), so this costs no torch start-up. The torchrun
launch itself is covered by the accuracy job's tests (test_accuracy_job.py).
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch.distributed as dist

from dcp_a2a.testing import tasks as mp_tasks
from dcp_a2a.testing.rankpool import gpu_count
from dcp_a2a.testing.rankpool import pid_alive
from dcp_a2a.testing.tasks import new_pool

pytestmark = pytest.mark.multiproc


def test_collective_bench_runs_on_two_ranks(tmp_path, project_only):
    out = tmp_path / "coll.json"
    argv = ["--collective", "--shapes", "2x4", "--head-dim", "6", "--iters", "2",
            "--out", str(out)]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    # its own pool: the task replaces the ranks' process group, so the pool is closed after it
    pool = new_pool(2, pg_timeout=30.0, task_timeout=120.0)
    try:
        status = pool.run(mp_tasks.as_torchrun_rank, store.port, "dcp_a2a.testing.bench", argv)
    finally:
        pool.close()
    assert not [p for p in pool.spawned_pids if pid_alive(p)]
    assert status == [0, 0]
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert report["world_size"] == 2 and (row["B"], row["H"], row["N"]) == (2, 4, 2)
    for backend in ("packed", "two_collective", "ag_rs"):
        assert row[f"{backend}_us"] > 0
        # CPU ranks: wall clock; gloo ranks on a GPU: events (gloo's collectives do not
        # capture, and trying made the next barrier fail on an H200)
        assert row[f"{backend}_timing"] == ("events" if gpu_count() else "wall")
        assert row[f"{backend}_untimed_calls"] >= 1


@pytest.mark.parametrize("warmup_ms, want", [(25.0, 25), (0.0, 0)])
def test_ranks_agree_on_the_warm_up_count(rank_pool, warmup_ms, want):
    # 1 ms a call on rank 0 asks for 25 calls, 5 ms on rank 1 for 5: both run the 25, or rank 1
    # would leave rank 0 waiting in its last 20 collectives
    counts = rank_pool.run(mp_tasks.warmup_calls, 2, warmup_ms, per_rank=[(1.0,), (5.0,)], n=2)
    assert counts == [want, want]
