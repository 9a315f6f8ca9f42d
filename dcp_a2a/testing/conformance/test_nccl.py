"""The contract on real NCCL groups: rank r on cuda:r, an NCCL group of 2 (and 4 where there
are 4 GPUs). Skipped with the reason on machines with fewer GPUs."""

from __future__ import annotations

import pytest

from dcp_a2a.testing.data import DTYPES, partials
from dcp_a2a.testing.groups import masked_partials, run_and_check
from dcp_a2a.testing.plugin import need_gpus as _need

pytestmark = [
    pytest.mark.multigpu, pytest.mark.multiproc, pytest.mark.conformance, pytest.mark.clause("exchange"),
    pytest.mark.needs("lse_reduce"),
]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nccl_matches_oracle(nccl_pool, merge_check, impl, n, dtype):
    _need(n)
    cases, data, oracle = [], [], []
    env = impl.envelope
    env.require(world_size=n)
    for i, base_e in enumerate(b for b in (True, False) if not env.outside(base_e=b)):
        outs, lses = partials(n, 16, 16 * n, env.fit_head_dim(96), dtype, seed=40 + n + i)
        cases.append(dict(return_lse=True, base_e=base_e, query_start_loc=None, backend=None))
        data.append((outs, lses, None))
        oracle.append(lses)
        if not impl.exposes("masking"):
            continue
        outs, lses, oracle_lses, seq_lens, qsl = masked_partials(n, dtype, seed=90 + i, hpr=4,
                                                                 d=env.fit_head_dim(72))
        cases.append(dict(return_lse=True, base_e=base_e, query_start_loc=qsl, backend=None))
        data.append((outs, lses, seq_lens))
        oracle.append(oracle_lses)
    run_and_check(nccl_pool, merge_check, n, cases, data, oracle)


