"""Bad arguments of the in-process exchange and of SymmMemBuffers are refused before anything
runs, naming the rank and the field: mismatched ranks once returned uninitialised
memory (all_to_all) or failed deep in a tensor op (lse_reduce_in_process), and a group of None
was an AttributeError (SymmMemBuffers) where lse_reduce gives a clear TypeError."""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a.inprocess import all_to_all, lse_reduce_in_process

pytestmark = pytest.mark.unit


def test_all_to_all_refuses_ranks_of_other_shapes():
    # rank 1 has three slices for two ranks: its third would never be read, and rank 1's
    # receive buffer (shaped like its send) would keep a row of uninitialised memory
    with pytest.raises(ValueError, match=r"rank 1's send buffer has shape \(3, 3\) but rank "
                                         r"0's has \(2, 3\)"):
        all_to_all([torch.zeros(2, 3), torch.zeros(3, 3)])
    with pytest.raises(ValueError, match="rank 1's send buffer has dtype torch.float16"):
        all_to_all([torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float16)])
    with pytest.raises(ValueError, match=r"first axis must hold one slice per rank, 2"):
        all_to_all([torch.zeros(3, 3), torch.zeros(3, 3)])
    with pytest.raises(TypeError, match="rank 1's send buffer must be a torch.Tensor"):
        all_to_all([torch.zeros(2, 3), [0.0] * 6])


def test_all_to_all_refuses_receive_buffers_that_do_not_fit():
    sends = [torch.arange(6.0).view(2, 3) + 10 * r for r in range(2)]
    with pytest.raises(ValueError, match="got 2 ranks' send buffers but 1 receive buffers"):
        all_to_all(sends, [torch.empty(2, 3)])
    with pytest.raises(ValueError, match=r"rank 1's receive buffer has shape \(2, 4\)"):
        all_to_all(sends, [torch.empty(2, 3), torch.empty(2, 4)])
    with pytest.raises(ValueError, match=r"rank 0's receive buffer has shape \(2, 4\) but the "
                                         r"send buffers have \(2, 3\)"):
        all_to_all(sends, [torch.empty(2, 4), torch.empty(2, 4)])
    recvs = all_to_all(sends, [torch.empty(2, 3), torch.empty(2, 3)])
    assert torch.equal(recvs[1], torch.stack([sends[0][1], sends[1][1]]))


@pytest.mark.parametrize("field, rank1, match", [
    ("B", dict(b=3), r"rank 1's out has shape \(3, 4, 8\) but rank 0's has \(2, 4, 8\)"),
    ("dtype", dict(dtype=torch.float16), r"rank 1's out has dtype torch.float16 but rank 0's "
                                         r"has torch.float32"),
    ("lse", dict(lse_dtype=torch.float16), r"rank 1's lse has dtype torch.float16"),
])
def test_lse_reduce_in_process_names_the_rank_that_differs(field, rank1, match):
    def rank(b=2, dtype=torch.float32, lse_dtype=torch.float32):
        return torch.zeros(b, 4, 8, dtype=dtype), torch.zeros(b, 4, dtype=lse_dtype)

    (o0, l0), (o1, l1) = rank(), rank(**rank1)
    with pytest.raises(ValueError, match=match):
        lse_reduce_in_process([o0, o1], [l0, l1])


def test_lse_reduce_in_process_wants_seq_lens_of_every_rank():
    outs, lses = [torch.zeros(2, 4, 8)] * 2, [torch.zeros(2, 4)] * 2
    with pytest.raises(ValueError, match="2 ranks' partials but 1 ranks' seq_lens"):
        lse_reduce_in_process(outs, lses, seq_lens=[torch.ones(1, dtype=torch.int32)],
                              query_start_loc=torch.tensor([0, 2], dtype=torch.int32))


class _NoDeviceGroup:
    world_size, rank_in_group = 2, 0


@pytest.mark.parametrize("group", [None, _NoDeviceGroup()], ids=["None", "no_device_group"])
def test_symm_mem_buffers_refuse_a_group_as_lse_reduce_does(group):
    """The same TypeError, word for word, as lse_reduce's for the same group; before any other
    argument is looked at (max_tokens=-1 here would be a ValueError)."""
    kw = dict(max_tokens=-1, num_heads=4, head_dim=8, dtype=torch.float32)
    with pytest.raises(TypeError, match="group must have world_size, rank_in_group and "
                                        "device_group") as theirs:
        dcp_a2a.SymmMemBuffers(group, **kw)
    with pytest.raises(TypeError) as ours:
        dcp_a2a.lse_reduce(torch.zeros(1, 4, 8), torch.zeros(1, 4), group)
    assert str(theirs.value) == str(ours.value)


def test_symm_mem_buffers_refuse_a_rank_outside_the_group():
    group = dcp_a2a.Group(2, 2, None)
    with pytest.raises(ValueError, match="rank_in_group=2 is not below world_size=2"):
        dcp_a2a.SymmMemBuffers(group, max_tokens=1, num_heads=4, head_dim=8,
                               dtype=torch.float32)


def test_lse_reduce_in_process_counts_lses_and_buffers_per_rank():
    outs, lses = [torch.zeros(2, 4, 8)] * 2, [torch.zeros(2, 4)] * 2
    with pytest.raises(ValueError, match="got 2 outputs but 1 LSEs"):
        lse_reduce_in_process(outs, lses[:1])
    with pytest.raises(ValueError, match="2 ranks' partials but 3 ranks' buffers"):
        lse_reduce_in_process(outs, lses, buffers=[None] * 3)
