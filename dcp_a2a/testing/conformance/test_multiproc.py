"""``lse_reduce`` of the implementation under test on real gloo process groups of N = 2, 3, 4
and 8 ranks (the ``rank_pool`` fixture: on a GPU machine the ranks compute on the GPUs).

Every rank gets different partials (seeded per test), the ranks run the implementation on a
real ``torch.distributed`` group, and the test process checks every rank's result against the
float64 oracle of all ranks' inputs for that rank's heads [r*H/N, (r+1)*H/N), with the bounds of
tolerances.yaml (the ``merge_check`` fixture).
"""

from __future__ import annotations

import math

import pytest
import torch

from dcp_a2a.testing import tasks as mp_tasks
from dcp_a2a.testing.data import DTYPES, partials
from dcp_a2a.testing.groups import masked_partials, run_and_check
from dcp_a2a.testing.verdicts import Convention

pytestmark = [pytest.mark.multiproc, pytest.mark.conformance, pytest.mark.clause("exchange"),
              pytest.mark.needs("lse_reduce")]

BASES = (True, False)  # is_lse_base_on_e


def _ids(dt):
    return str(dt).removeprefix("torch.")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_matches_oracle_on_every_rank(rank_pool, merge_check, impl, n, dtype):
    """fp16/bf16/fp32 x base e/2 x return_lse, D not a power of two, different data per rank."""
    cases, data = [], []
    d = impl.envelope.fit_head_dim(40)
    bases = [b for b in BASES if not impl.envelope.outside(base_e=b)]
    for i, (base_e, ret) in enumerate([(b, r) for b in bases for r in (True, False)]):
        outs, lses = partials(n, 2, 2 * n, d, dtype, seed=1000 * n + 10 * i + DTYPES.index(dtype))
        cases.append(dict(return_lse=ret, base_e=base_e, query_start_loc=None, backend=None))
        data.append((outs, lses, None))
    run_and_check(rank_pool, merge_check, n, cases, data)


@pytest.mark.clause("masking")  # overrides the module's clause
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("n", [2, 4])
def test_empty_shards_and_padding_rows(rank_pool, merge_check, impl, n, dtype):
    """A rank with no KV for a request (NaN partial, large LSE) and padding rows past
    query_start_loc[-1] must not leak into the merge; all-empty rows merge to 0 / -inf."""
    cases, data, oracle = [], [], []
    bases = [b for b in BASES if not impl.envelope.outside(base_e=b)]
    for i, base_e in enumerate(bases):
        outs, lses, oracle_lses, seq_lens, qsl = masked_partials(
            n, dtype, seed=77 + 10 * n + i, empty_rank=n - 1,
            d=impl.envelope.fit_head_dim(24))
        cases.append(dict(return_lse=True, base_e=base_e, query_start_loc=qsl, backend=None))
        data.append((outs, lses, seq_lens))
        oracle.append(oracle_lses)
    results = run_and_check(rank_pool, merge_check, n, cases, data, oracle)
    for r in range(n):
        for res in results[r]:
            if "unsupported" in res:
                continue
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


@pytest.mark.parametrize("n,b,h,d", SHAPES)
def test_shapes(rank_pool, merge_check, impl, n, b, h, d):
    cases, data = [], []
    d = impl.envelope.fit_head_dim(d)
    for i, dtype in enumerate(DTYPES):
        outs, lses = partials(n, b, h, d, dtype, seed=500 + i + 7 * d + b)
        base_e = i != 2 if not impl.envelope.outside(base_e=i != 2) else impl.envelope.base_e
        cases.append(dict(return_lse=i != 1, base_e=base_e, query_start_loc=None, backend=None))
        data.append((outs, lses, None))
    run_and_check(rank_pool, merge_check, n, cases, data)


def test_eight_ranks(rank_pool, merge_check, impl):
    """N = 8 (one head per rank): plain partials in fp16 and, where the implementation masks,
    masked ones in bf16."""
    n = 8
    env = impl.envelope
    d = env.fit_head_dim(24)
    outs, lses = partials(n, 2, 8, d, torch.float16, seed=88)
    cases = [dict(return_lse=False, base_e=True if "e" in env.bases else False,
                  query_start_loc=None, backend=None)]
    data, oracle = [(outs, lses, None)], [lses]
    if impl.exposes("masking"):
        m_outs, m_lses, m_oracle, seq_lens, qsl = masked_partials(n, torch.bfloat16, seed=8,
                                                                  hpr=1, empty_rank=5, d=d)
        cases.append(dict(return_lse=True, base_e=False if "2" in env.bases else True,
                          query_start_loc=qsl, backend=None))
        data.append((m_outs, m_lses, seq_lens))
        oracle.append(m_oracle)
    run_and_check(rank_pool, merge_check, n, cases, data, oracle)


@pytest.mark.clause("bad input")  # overrides the module's clause
def test_bad_head_split_raises_on_every_rank_without_hanging(rank_pool, impl):
    """H not divisible by N: every rank raises ValueError before entering a collective (a
    rank that entered one would hang its peers; the pool's watchdog would then fail this)."""
    n = 3
    out, lse = partials(1, 2, 4, 8, torch.float16, seed=3)
    res = rank_pool.run(mp_tasks.reduce_expect_error, n, out[0], lse[0], {},
                        n=n, timeout=30)
    for r, got in enumerate(res):
        assert got is not None, f"bad input accepted: rank {r} took H=4 over N=3 ranks"
        if got[0] != "ValueError":
            raise Convention(f"rank {r}: refused with {got[0]}, not a ValueError: {got}")


