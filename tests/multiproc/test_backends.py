"""The project's backends on real gloo process groups of N = 2, 3, 4 ranks: packed,
two_collective and ag_rs on the same partials (the contract tests of lse_reduce on process
groups are the conformance suite's, dcp_a2a/testing/conformance/test_multiproc.py)."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.testing.data import DTYPES, bits_view
from dcp_a2a.testing.groups import check_rank_result, masked_partials, run_cases
from dcp_a2a.testing.data import heads_of

pytestmark = pytest.mark.multiproc

BASES = (True, False)  # is_lse_base_on_e


def _ids(dt):
    return str(dt).removeprefix("torch.")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_backends_agree_and_match_oracle(rank_pool, merge_check, project_only, record_property,
                                         n, dtype):
    """packed, two_collective and ag_rs on the same partials (with empty shards and padding):
    packed and two_collective bitwise identical (outputs and LSEs), all three within their
    bounds, and ag_rs's distance from the oracle reported next to the A2A paths'. One LSE base
    per (N, dtype), alternating, so each N and each dtype sees both."""
    from dcp_a2a.testing.compare import check_merge

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
