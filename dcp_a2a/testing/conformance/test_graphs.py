"""Buffer lifetimes under CUDA graphs and streams, for any implementation (the scenarios of
dcp_a2a.testing.graphs): on one GPU (a group of one: the exchange is the identity, the buffers
are real) and on an NCCL group of 2 ranks. The mutant corpus holds one broken implementation
per scenario class (graph_buffer_regrows, graph_output_shared, staging_carved_next_to_inputs,
staging_shared_across_streams);
the self-check shows each is killed here on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a import Group
from dcp_a2a.testing import graphs
from dcp_a2a.testing import tasks as mp_tasks
from dcp_a2a.testing.plugin import need_gpus

pytestmark = [pytest.mark.conformance, pytest.mark.clause("graphs")]


def _report(failures):
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:20])


@pytest.mark.gpu
@pytest.mark.parametrize("scenario", graphs.CUDA_ONLY)
def test_on_one_gpu(impl, scenario):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (CUDA graphs and streams)")
    _report(graphs.run(scenario, impl, Group(1, 0, None), 0, 1, torch.device("cuda", 0)))


@pytest.mark.kernel
def test_staging_next_to_inputs(impl, device):
    """Partials carved from one workspace (out, lse, live neighbours), right after a previous
    call's results were freed: on the CPU too."""
    _report(graphs.run("staging_next_to_inputs", impl, Group(1, 0, None), 0, 1, device))


@pytest.mark.multigpu
@pytest.mark.multiproc
@pytest.mark.parametrize("scenario", graphs.SCENARIOS)
def test_on_an_nccl_pair(nccl_pool, impl, scenario):
    need_gpus(2)
    per_rank = nccl_pool.run(mp_tasks.graph_scenario, scenario, n=2, timeout=300)
    _report([f for failures in per_rank for f in failures])
