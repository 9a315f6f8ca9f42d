"""The group contract on real gloo ranks: a swapped rank_in_group is refused on every rank
before any collective (ag_rs would weight the local output by the wrong rank and return wrong
results with exit 0), and ranks that disagree on the call fail on every rank with the field
and the ranks named (the pool's ranks run with $DCP_A2A_CHECK_RANKS=1, as the multi-process
tier and the accuracy job do), never with a gloo abort on one rank and garbage on the other."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.testing import tasks as mp_tasks
from dcp_a2a.testing.data import partials

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs"])
def test_swapped_rank_in_group_is_refused_on_every_rank(rank_pool, project_only, backend):
    outs, lses = partials(2, 3, 4, 16, torch.bfloat16, seed=7)
    answers = rank_pool.run(mp_tasks.reduce_expect_error_per_rank, 2, {"backend": backend},
                            per_rank=[(outs[r], lses[r], 1 - r) for r in range(2)], n=2)
    for r, answer in enumerate(answers):
        assert answer is not None, f"rank {r} accepted rank_in_group={1 - r}"
        kind, message = answer
        assert kind == "ValueError" and f"rank_in_group={1 - r} but this process is rank {r}" \
            in message, answer


@pytest.mark.parametrize("differ", ["D", "dtype", "B"])
def test_ranks_that_disagree_fail_on_every_rank_naming_the_field(rank_pool, project_only,
                                                                  differ):
    """Rank 0 and rank 1 pass different calls; both get the same ValueError."""
    shapes = {"D": [(3, 4, 64), (3, 4, 48)], "B": [(3, 4, 16), (5, 4, 16)],
              "dtype": [(3, 4, 16), (3, 4, 16)]}[differ]
    dtypes = [torch.bfloat16, torch.float16 if differ == "dtype" else torch.bfloat16]
    per_rank = []
    for r, ((b, h, d), dt) in enumerate(zip(shapes, dtypes)):
        outs, lses = partials(1, b, h, d, dt, seed=20 + r)
        per_rank.append((outs[0], lses[0]))
    answers = rank_pool.run(mp_tasks.reduce_expect_error_per_rank, 2, {}, per_rank=per_rank,
                            n=2)
    want = {"D": "D: 64 on rank 0; 48 on rank 1", "B": "B: 3 on rank 0; 5 on rank 1",
            "dtype": "dtype: bfloat16 on rank 0; float16 on rank 1"}[differ]
    for r, answer in enumerate(answers):
        assert answer is not None, f"rank {r}: the disagreeing call was accepted"
        assert answer[0] == "ValueError" and want in answer[1], answer
