"""``lse_reduce`` on real gloo process groups of N = 2, 3, 4 (and 8) ranks.

Every rank gets different partials (seeded per test), the ranks run the implementation under
test on a real ``torch.distributed`` group, and the test process checks every rank's result
against the float64 oracle of all ranks' inputs for that rank's heads
[r*H/N, (r+1)*H/N), with the bounds of tolerances.yaml (the ``merge_check`` fixture). Several
cases go to the pool in one task to amortise the round trip.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.multiproc import mp_tasks
from tests._data import DTYPES, bits_view, partials
from tests.multiproc.mp_tasks import heads_of

pytestmark = pytest.mark.multiproc

BASES = (True, False)  # is_lse_base_on_e


def _ids(dt):
    return str(dt).removeprefix("torch.")


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
    assert "bad_return" not in res, res.get("bad_return")
    assert res["inputs_intact"], f"rank {rank}: lse_reduce modified its input out/lse"
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


def _run_and_check(rank_pool, merge_check, n, cases, data):
    """Run ``cases`` on every rank of the N-rank group and check each rank's results."""
    results = run_cases(rank_pool, n, cases, data)
    for r in range(n):
        for case, (outs, lses, _), res in zip(cases, data, results[r]):
            check_rank_result(merge_check, res, r, n, outs, lses, case)


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


# --------------------------------------------------------------------------- contract tests
@pytest.mark.conformance
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_matches_oracle_on_every_rank(rank_pool, merge_check, impl, n, dtype):
    """fp16/bf16/fp32 x base e/2 x return_lse, D not a power of two, different data per rank."""
    cases, data = [], []
    for i, (base_e, ret) in enumerate([(b, r) for b in BASES for r in (True, False)]):
        outs, lses = partials(n, 2, 2 * n, 40, dtype, seed=1000 * n + 10 * i + DTYPES.index(dtype))
        cases.append(dict(return_lse=ret, base_e=base_e, query_start_loc=None, backend=None))
        data.append((outs, lses, None))
    _run_and_check(rank_pool, merge_check, n, cases, data)


@pytest.mark.conformance
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("n", [2, 4])
def test_empty_shards_and_padding_rows(rank_pool, merge_check, impl, n, dtype):
    """A rank with no KV for a request (NaN partial, large LSE) and padding rows past
    query_start_loc[-1] must not leak into the merge; all-empty rows merge to 0 / -inf."""
    cases, data, oracle = [], [], []
    for i, base_e in enumerate(BASES):
        outs, lses, oracle_lses, seq_lens, qsl = masked_partials(
            n, dtype, seed=77 + 10 * n + i, empty_rank=n - 1)
        cases.append(dict(return_lse=True, base_e=base_e, query_start_loc=qsl, backend=None))
        data.append((outs, lses, seq_lens))
        oracle.append(oracle_lses)
    results = run_cases(rank_pool, n, cases, data)
    for r in range(n):
        for case, (outs, _, _), oracle_lses, res in zip(cases, data, oracle, results[r]):
            check_rank_result(merge_check, res, r, n, outs, oracle_lses, case)
            out, lse = res["out"], res["lse"]
            assert torch.equal(out[4:].float(), torch.zeros_like(out[4:].float())), \
                f"rank {r}: padding rows must merge to 0"
            assert bool((lse[4:] == -math.inf).all()), f"rank {r}: padding rows need lse -inf"


SHAPES = [  # (N, B, H, D): B = 1, B = 0, head_dim odd / 1 / 100, one head per rank
    pytest.param(3, 1, 6, 72, id="N3-B1-D72"),
    pytest.param(2, 0, 4, 40, id="N2-B0"),
    pytest.param(4, 2, 4, 1, id="N4-D1-one_head_per_rank"),
    pytest.param(2, 2, 2, 100, id="N2-D100"),
]


@pytest.mark.conformance
@pytest.mark.parametrize("n,b,h,d", SHAPES)
def test_shapes(rank_pool, merge_check, impl, n, b, h, d):
    cases, data = [], []
    for i, dtype in enumerate(DTYPES):
        outs, lses = partials(n, b, h, d, dtype, seed=500 + i + 7 * d + b)
        cases.append(dict(return_lse=i != 1, base_e=i != 2, query_start_loc=None, backend=None))
        data.append((outs, lses, None))
    _run_and_check(rank_pool, merge_check, n, cases, data)


@pytest.mark.conformance
def test_eight_ranks(rank_pool, merge_check, impl):
    """N = 8 (one head per rank): plain partials in fp16 and masked ones in bf16."""
    n = 8
    outs, lses = partials(n, 2, 8, 24, torch.float16, seed=88)
    m_outs, m_lses, m_oracle, seq_lens, qsl = masked_partials(n, torch.bfloat16, seed=8,
                                                              hpr=1, empty_rank=5)
    cases = [dict(return_lse=False, base_e=True, query_start_loc=None, backend=None),
             dict(return_lse=True, base_e=False, query_start_loc=qsl, backend=None)]
    results = run_cases(rank_pool, n, cases, [(outs, lses, None), (m_outs, m_lses, seq_lens)])
    for r in range(n):
        check_rank_result(merge_check, results[r][0], r, n, outs, lses, cases[0])
        check_rank_result(merge_check, results[r][1], r, n, m_outs, m_oracle, cases[1])


@pytest.mark.conformance
def test_bad_head_split_raises_on_every_rank_without_hanging(rank_pool, impl):
    """H not divisible by N: every rank raises ValueError before entering a collective (a
    rank that entered one would hang its peers; the pool's watchdog would then fail this)."""
    n = 3
    out, lse = partials(1, 2, 4, 8, torch.float16, seed=3)
    res = rank_pool.run(mp_tasks.reduce_expect_error, n, out[0], lse[0], {},
                        n=n, timeout=30)
    for r, got in enumerate(res):
        assert got is not None, f"rank {r}: H=4 over N=3 ranks was accepted"
        assert got[0] == "ValueError", f"rank {r}: expected ValueError, got {got}"


# --------------------------------------------------------------------------- project backends
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_backends_agree_and_match_oracle(rank_pool, merge_check, project_only, record_property,
                                         n, dtype):
    """packed, two_collective and ag_rs on the same partials (with empty shards and padding):
    packed and two_collective bitwise identical (outputs and LSEs), all three within their
    bounds, and ag_rs's distance from the oracle reported next to the A2A paths'. One LSE base
    per (N, dtype), alternating, so each N and each dtype sees both."""
    from dcp_a2a.compare import check_merge

    backends = ("packed", "two_collective", "ag_rs")
    bases = (BASES[(n + DTYPES.index(dtype)) % 2],)
    cases, data, oracle = [], [], []
    for i, base_e in enumerate(bases):
        outs, lses, oracle_lses, seq_lens, qsl = masked_partials(
            n, dtype, seed=300 + 10 * n + i + 3 * DTYPES.index(dtype), hpr=3, d=40,
            empty_rank=i % n)
        for be in backends:
            cases.append(dict(return_lse=True, base_e=base_e, query_start_loc=qsl, backend=be))
            data.append((outs, lses, seq_lens))
            oracle.append(oracle_lses)
    results = run_cases(rank_pool, n, cases, data)
    for r in range(n):
        res = dict(zip([(c["base_e"], c["backend"]) for c in cases], results[r]))
        for case, (outs, _, _), oracle_lses in zip(cases, data, oracle):
            kind = "ag_rs" if case["backend"] == "ag_rs" else "a2a"
            check_rank_result(merge_check, res[(case["base_e"], case["backend"])], r, n, outs,
                              oracle_lses, case, kind=kind)
        for base_e in bases:
            p, t = res[(base_e, "packed")], res[(base_e, "two_collective")]
            assert torch.equal(bits_view(p["out"]), bits_view(t["out"])), \
                f"rank {r}, base {'e' if base_e else '2'}: packed and two_collective outputs differ"
            assert torch.equal(bits_view(p["lse"]), bits_view(t["lse"])), \
                f"rank {r}, base {'e' if base_e else '2'}: packed and two_collective LSEs differ"

    # the ag_rs vs A2A comparison (printed in the terminal summary)
    for bi, base_e in enumerate(bases):
        outs, oracle_lses = data[bi * 3][0], oracle[bi * 3]
        row = dict(dtype=str(dtype).removeprefix("torch."), world_size=n,
                   base="e" if base_e else "2")
        for name, be in (("a2a", "packed"), ("ag_rs", "ag_rs")):
            reps = [check_merge(results[r][bi * 3 + backends.index(be)]["out"], None, outs,
                                oracle_lses, is_lse_base_on_e=base_e, kind=name,
                                heads=heads_of(r, n, outs.shape[2]), keep_ulp_errors=False)
                    for r in range(n)]
            row[f"{name}_max_ulp"] = max(x.output.max_ulp_err for x in reps)
            row[f"{name}_max_abs"] = max(x.output.max_abs_err for x in reps)
            row[f"{name}_worst_ratio"] = max(x.output.worst_ratio for x in reps)
        row["ag_rs_ratio_vs_a2a_bound"] = max(
            check_merge(results[r][bi * 3 + 2]["out"], None, outs, oracle_lses,
                        is_lse_base_on_e=base_e, kind="a2a", heads=heads_of(r, n, outs.shape[2]),
                        keep_ulp_errors=False).output.worst_ratio
            for r in range(n))
        record_property("ag_rs_vs_a2a", row)
