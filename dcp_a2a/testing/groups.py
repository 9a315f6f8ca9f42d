"""Running cases on the ranks of a pool and checking each rank's result against the oracle:
shared by the conformance suite's multi-process tests and the project's own (backends, NCCL).

``run_cases`` sends every rank its partials (several cases per task, to amortise the round
trip); ``check_rank_result`` checks one rank's result against the float64 oracle of all ranks'
inputs for that rank's heads [r*H/N, (r+1)*H/N) with the bounds of tolerances.yaml.
"""

from __future__ import annotations

import math

import torch

from . import tasks as mp_tasks
from .data import partials
from .data import heads_of


def run_cases(pool, n, cases, data):
    """``data[i]`` = (outs[N,B,H,D], lses[N,B,H], seq_lens[N][S] or None). Returns
    results[rank][case]."""
    per_rank = [
        ([(outs[r], lses[r], None if sl is None else sl[r]) for outs, lses, sl in data],)
        for r in range(n)
    ]
    return pool.run(mp_tasks.reduce_cases, n, cases, per_rank=per_rank, n=n)


def check_rank_result(merge_check, res, rank, n, outs, lses, case, *, kind="a2a"):
    """One rank's result against the oracle of all ranks' (effective) partials."""
    from .verdicts import Defect

    assert "bad_return" not in res, res.get("bad_return")
    if res["inputs_modified"]:
        raise Defect(f"rank {rank}: lse_reduce modified the caller's "
                     f"{', '.join(res['inputs_modified'])}")
    B, H, D = outs.shape[1:]
    hpr = H // n
    out, lse = res["out"], res["lse"]
    assert out.dtype == outs.dtype, f"rank {rank}: output dtype {out.dtype} != {outs.dtype}"
    assert tuple(out.shape) == (B, hpr, D), f"rank {rank}: output shape {tuple(out.shape)}"
    if case["return_lse"]:
        assert lse is not None and tuple(lse.shape) == (B, hpr)
    else:
        assert lse is None
    return merge_check(out, lse, outs, lses, is_lse_base_on_e=case["base_e"], kind=kind,
                       heads=heads_of(rank, n, H))


def run_and_check(rank_pool, merge_check, n, cases, data, oracle_lses=None):
    """Run ``cases`` on every rank of the N-rank group and check each rank's results against
    the oracle of ``data``'s partials (with ``oracle_lses[i]`` in place of case i's LSEs where
    masking changes what the oracle must see). Returns results[rank][case]."""
    results = run_cases(rank_pool, n, cases, data)
    oracle_lses = oracle_lses or [lses for _, lses, _ in data]
    judged = 0
    unsupported = set()
    for r in range(n):
        for case, (outs, _, _), o_lses, res in zip(cases, data, oracle_lses, results[r]):
            if "unsupported" in res:  # a case the engine's API cannot express: the others run
                unsupported.add(res["unsupported"])
                continue
            check_rank_result(merge_check, res, r, n, outs, o_lses, case)
            judged += 1
    if not judged and unsupported:
        import pytest

        from .surfaces import NOT_APPLICABLE

        pytest.skip(NOT_APPLICABLE + "; ".join(sorted(unsupported)))
    return results


# --------------------------------------------------------------------------- data
def masked_partials(n, dtype, *, seed, hpr=2, d=24, empty_rank=1):
    """Partials with empty KV shards and padding rows, and what the oracle must see.

    Requests (query rows via query_start_loc = [0, 1, 3, 4, 4]; row 4 is padding):
      r0 rows [0, 1)  every rank has KV
      r1 rows [1, 3)  ``empty_rank`` has seq_len 0 there: its partial is NaN with a large LSE
      r2 rows [3, 4)  only rank 0 has KV; the others hold finite garbage with a large LSE
      r3 no rows      (a request with no query rows; the row search must skip it)
    Padding rows hold NaN outputs with large LSEs on every rank. Garbage LSEs are chosen to
    dominate the merge, so an unmasked row cannot pass. The oracle's LSEs are -inf wherever
    the contract says the row is empty.
    """
    b = 5
    qsl = torch.tensor([0, 1, 3, 4, 4], dtype=torch.int32)
    outs, lses = partials(n, b, hpr * n, d, dtype, seed=seed)
    seq_lens = []
    oracle_lses = lses.clone()
    for r in range(n):
        sl = torch.tensor([5 + r, 0 if r == empty_rank else 3, 7 if r == 0 else 0, 2],
                          dtype=torch.int32)
        seq_lens.append(sl)
        if r == empty_rank:
            outs[r, 1:3] = float("nan")
            lses[r, 1:3] = 40.0
            oracle_lses[r, 1:3] = -math.inf
        if r != 0:
            outs[r, 3] = 1000.0
            lses[r, 3] = 45.0
            oracle_lses[r, 3] = -math.inf
    outs[:, 4:] = float("nan")
    lses[:, 4:] = 50.0
    oracle_lses[:, 4:] = -math.inf
    return outs, lses, oracle_lses, seq_lens, qsl
