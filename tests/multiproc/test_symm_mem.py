"""backend="symm_mem" on real ranks: bitwise equal to packed on an NCCL group of GPUs, safe when
ranks race (back-to-back calls, CUDA-graph replays), empty shards and B = 0; refused with a clear
error on gloo groups. The kernels' layout and arithmetic on one process are covered in
tests/kernel/test_symm_mem.py (CPU too)."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.testing import tasks as mp_tasks
from dcp_a2a.testing.data import bits_view, partials
from dcp_a2a.testing.groups import masked_partials, run_and_check, run_cases
from dcp_a2a.testing.plugin import need_gpus as _need

pytestmark = [pytest.mark.multiproc]

BACK_TO_BACK = 1000


@pytest.mark.multigpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_bitwise_equal_to_packed_with_masks_and_odd_head_dims(nccl_pool, merge_check,
                                                              project_only, dtype):
    _need(2)
    n = 2
    cases, data, oracle = [], [], []
    for base_e in (True, False):
        for d in (512, 80, 7):  # not a power of two; odd (no paired 32-bit lanes)
            outs, lses = partials(n, 9, 4 * n, d, dtype, seed=d + base_e)
            data.append((outs, lses, None))
            oracle.append(lses)
            cases.append(dict(return_lse=True, base_e=base_e, query_start_loc=None))
        outs, lses, oracle_lses, seq_lens, qsl = masked_partials(n, dtype, seed=3 + base_e,
                                                                 hpr=3, d=72)
        data.append((outs, lses, seq_lens))
        oracle.append(oracle_lses)
        cases.append(dict(return_lse=True, base_e=base_e, query_start_loc=qsl))
    symm = [dict(c, backend="symm_mem") for c in cases]
    packed = [dict(c, backend="packed") for c in cases]
    got = run_and_check(nccl_pool, merge_check, n, symm, data, oracle)
    want = run_cases(nccl_pool, n, packed, data)
    for r in range(n):
        for i, (g, w) in enumerate(zip(got[r], want[r])):
            assert torch.equal(bits_view(g["out"]), bits_view(w["out"])), (r, i)
            assert torch.equal(bits_view(g["lse"]), bits_view(w["lse"])), (r, i)


@pytest.mark.multigpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph_replays"])
def test_racing_ranks_get_the_right_bytes_every_call(nccl_pool, project_only, graph):
    """1000 calls (or graph replays) with a random spin-kernel delay per rank before each: a
    fast rank must never overwrite a slot a slow rank still reads, nor a call read a stale
    slot. Every call's bits must equal packed's."""
    _need(2)
    n = 2
    outs, lses = partials(n, 4, 8 * n, 128, torch.bfloat16, seed=11)
    per_rank = [(outs[r], lses[r], BACK_TO_BACK, 5, graph) for r in range(n)]
    results = nccl_pool.run(mp_tasks.symm_back_to_back, n, per_rank=per_rank, n=n,
                            timeout=300)
    for r, res in enumerate(results):
        assert res == dict(calls=BACK_TO_BACK, wrong=0), (r, res)


@pytest.mark.multigpu
def test_empty_batch(nccl_pool, project_only):
    """B = 0 on every rank: empty results, no signal and no wait (a following call still
    pairs up with its peers' call)."""
    _need(2)
    n = 2
    empty = partials(n, 0, 2 * n, 16, torch.bfloat16, seed=1)
    full = partials(n, 3, 2 * n, 16, torch.bfloat16, seed=2)
    cases = [dict(return_lse=True, base_e=True, query_start_loc=None, backend=be)
             for be in ("symm_mem", "symm_mem", "packed")]
    results = run_cases(nccl_pool, n, cases, [(*empty, None), (*full, None), (*full, None)])
    for r in range(n):
        e, g, w = results[r]
        assert e["out"].shape == (0, 2, 16) and e["lse"].shape == (0, 2)
        assert torch.equal(bits_view(g["out"]), bits_view(w["out"]))


def test_refused_on_gloo_groups(rank_pool, project_only):
    """gloo ranks (CPU, or GPUs through host memory) cannot store into each other's memory."""
    for answer in rank_pool.run(mp_tasks.symm_refusal, 2, n=2):
        assert answer.startswith("ValueError: backend='symm_mem' needs"), answer
    out, lse = partials(2, 2, 4, 8, torch.bfloat16, seed=0)
    answers = rank_pool.run(mp_tasks.reduce_expect_error, 2,
                            per_rank=[(out[r], lse[r], {"backend": "symm_mem"})
                                      for r in range(2)], n=2)
    for kind, msg in answers:
        assert kind == "ValueError" and "buffers=SymmMemBuffers" in msg, msg
