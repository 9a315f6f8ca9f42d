"""Buffer lifetimes under CUDA graphs and streams, for any implementation (the scenarios of
dcp_a2a.testing.graphs): on one GPU at N = 1 (a group of one) and at N = 2, 4, 8 (one simulated
rank of a MirrorGroup: every collective a device copy, so an implementation's staging for N >= 2
runs and is captured on one GPU), on the CPU for the scenarios that need no CUDA, and on an NCCL
group of 2 ranks. The mutant corpus holds one broken implementation per scenario class
(graph_buffer_regrows, graph_output_shared, staging_carved_next_to_inputs,
staging_regrows_multi_rank, staging_shared_across_streams); the self-check shows each is killed
here on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.testing import graphs
from dcp_a2a.testing import tasks as mp_tasks
from dcp_a2a.testing.plugin import need_gpus

pytestmark = [pytest.mark.conformance, pytest.mark.clause("graphs"),
              pytest.mark.needs("lse_reduce")]
SIZES = (1,) + graphs.MIRROR_SIZES


def _report(failures):
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:20])


def _run(scenario, impl, n, device):
    impl.envelope.require(world_size=n)
    group, rank = graphs.mirror_group(n)
    try:
        return graphs.run(scenario, impl, group, rank, n, device, mirror=n > 1)
    except Exception as e:
        if n > 1 and not torch.distributed.is_initialized():
            e.add_note(
                f"(N={n} here is one simulated rank of a MirrorGroup, with no default process "
                "group: the contract gives the group's size and this rank as group.world_size "
                "and group.rank_in_group, and its collectives take group.device_group; lookups "
                "in torch.distributed's world state, such as get_rank(group), get_backend(group) "
                "or get_process_group_ranks(group), fail here)")
        raise


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES, ids=lambda n: f"N{n}")
@pytest.mark.parametrize("scenario", graphs.CUDA_ONLY)
def test_on_one_gpu(impl, scenario, n):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (CUDA graphs and streams)")
    _report(_run(scenario, impl, n, torch.device("cuda", 0)))


@pytest.mark.kernel
@pytest.mark.parametrize("n", SIZES, ids=lambda n: f"N{n}")
@pytest.mark.parametrize("scenario", graphs.ANY_DEVICE)
def test_on_this_device(impl, device, scenario, n):
    """Results held together, and partials carved from one workspace right after a previous
    call's results were freed: on the CPU too."""
    _report(_run(scenario, impl, n, device))


@pytest.mark.multigpu
@pytest.mark.multiproc
@pytest.mark.parametrize("scenario", graphs.SCENARIOS)
def test_on_an_nccl_pair(nccl_pool, impl, scenario):
    need_gpus(2)
    per_rank = nccl_pool.run(mp_tasks.graph_scenario, scenario, n=2, timeout=300)
    _report([f for failures in per_rank for f in failures])
