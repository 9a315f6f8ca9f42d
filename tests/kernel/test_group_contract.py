"""The group ``lse_reduce`` is given, on the host: the MirrorGroup (N simulated ranks in one
process, the graphs clause's one-GPU group), a rank_in_group that is not the process group's,
and the opt-in check that every rank makes the same call. Real gloo ranks for the last two are
in tests/multiproc/test_group_checks.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from dcp_a2a import Group, lse_reduce
from dcp_a2a.collective import CHECK_RANKS_ENV
from dcp_a2a.testing.data import heads_of, partials
from dcp_a2a.testing.mirror import MirrorGroup

pytestmark = pytest.mark.kernel

BACKENDS = ("packed", "two_collective", "ag_rs")


def test_mirror_collectives_are_copies_of_this_rank():
    """rank r of N equal ranks: all_to_all receives send[r] from every peer, all_gather
    repeats the input, reduce_scatter sums N copies of slice r, through torch.distributed's
    public functions (no init_process_group)."""
    n, r = 4, 2
    pg = MirrorGroup(n, r)
    assert (pg.size(), pg.rank(), isinstance(pg, dist.ProcessGroup)) == (n, r, True)
    send = torch.arange(n * 3, dtype=torch.float32).view(n, 3)
    recv = torch.full_like(send, math.nan)
    dist.all_to_all_single(recv, send, group=pg)
    assert torch.equal(recv, send[r].expand(n, 3))
    gathered = torch.full((n * 3,), math.nan)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(gathered, send[1], group=pg)
    assert torch.equal(gathered.view(n, 3), send[1].expand(n, 3))
    scattered = torch.full((3,), math.nan)
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    rs(scattered, send.view(-1), group=pg)
    assert torch.equal(scattered, n * send[r])


def test_mirror_list_collectives_and_all_reduce():
    """The list forms a correct implementation may use instead (all_gather, all_to_all,
    reduce_scatter), all_reduce, broadcast and barrier: the same semantics; an unmodelled
    reduction is refused, not approximated."""
    n, r = 3, 1
    pg = MirrorGroup(n, r)
    x = torch.arange(n * 2, dtype=torch.float32).view(n, 2)
    outs = [torch.full((n, 2), math.nan) for _ in range(n)]
    dist.all_gather(outs, x, group=pg)
    assert all(torch.equal(o, x) for o in outs)
    recv = [torch.full((2,), math.nan) for _ in range(n)]
    dist.all_to_all(recv, list(x.unbind(0)), group=pg)
    assert all(torch.equal(o, x[r]) for o in recv)
    scattered = torch.full((2,), math.nan)
    dist.reduce_scatter(scattered, list(x.unbind(0)), group=pg)
    assert torch.equal(scattered, n * x[r])
    total, top = x.clone(), x.clone()
    dist.all_reduce(total, group=pg)
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=pg)
    assert torch.equal(total, n * x) and torch.equal(top, x)
    even = torch.full((n, 2), math.nan)
    dist.all_to_all_single(even, x, [1] * n, [1] * n, group=pg)  # explicit even splits
    assert torch.equal(even, x[r].expand(n, 2))
    with pytest.raises(ValueError, match="not 3 equal slices"):
        dist.all_to_all_single(even, x, [2, 1, 0], [1] * n, group=pg)
    with pytest.raises(ValueError, match="PRODUCT is not modelled"):
        dist.all_reduce(x.clone(), op=dist.ReduceOp.PRODUCT, group=pg)
    dist.broadcast(top, group=pg, group_src=0)
    dist.barrier(group=pg)
    assert torch.equal(top, x)


@pytest.mark.parametrize("bad", [(0, 1), (2, 2), (2, -1), (True, 0), (2.0, 0)])
def test_mirror_refuses_a_bad_size_or_rank(bad):
    with pytest.raises(ValueError, match="MirrorGroup"):
        MirrorGroup(*bad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_lse_reduce_on_a_mirror_merges_n_equal_partials(device, merge_check, n, backend):
    """N equal partials merge to the slice itself, with LSE + log N: within the derived bound
    of the float64 oracle of N copies (ag_rs: its own bound, it sums in the dtype)."""
    r = n - 1
    outs, lses = partials(1, 3, 8, 24, torch.bfloat16, seed=n, device=device)
    outs, lses = outs.expand(n, -1, -1, -1).contiguous(), lses.expand(n, -1, -1).contiguous()
    got, got_lse = lse_reduce(outs[r], lses[r], Group(n, r, MirrorGroup(n, r)), return_lse=True,
                              backend=backend, check_ranks=True)
    merge_check(got, got_lse, outs, lses, heads=heads_of(r, n, 8),
                kind="ag_rs" if backend == "ag_rs" else "a2a")
    want = lses[r][:, heads_of(r, n, 8)].double() + math.log(n)
    assert torch.allclose(got_lse.double(), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rank_in_group_that_is_not_the_process_groups_is_refused(device, backend):
    outs, lses = partials(1, 2, 4, 8, torch.float16, seed=1, device=device)
    with pytest.raises(ValueError, match=r"rank_in_group=0 but this process is rank 1"):
        lse_reduce(outs[0], lses[0], Group(2, 0, MirrorGroup(2, 1)), backend=backend)


def test_a_process_group_of_another_size_is_refused(device):
    outs, lses = partials(1, 2, 4, 8, torch.float16, seed=1, device=device)
    with pytest.raises(ValueError, match="has 4 ranks but group.world_size=2"):
        lse_reduce(outs[0], lses[0], Group(2, 1, MirrorGroup(4, 1)))


def test_torchs_older_method_names_reach_a_subclass_override():
    """torch 2.11 calls alltoall_base/_allgather_base/_reduce_scatter_base, torch 2.13 the
    *_single names: a MirrorGroup subclass overrides the new name and both versions see it (a
    test's disagreeing peer once took effect on the CPU's torch and not on the GPU's)."""
    seen = []

    class Spy(MirrorGroup):
        def all_to_all_single(self, *a, **k):
            seen.append("a2a")
            return super().all_to_all_single(*a, **k)

        def all_gather_single(self, *a, **k):
            seen.append("gather")
            return super().all_gather_single(*a, **k)

        def reduce_scatter_single(self, *a, **k):
            seen.append("scatter")
            return super().reduce_scatter_single(*a, **k)

    pg, x = Spy(2, 0), torch.arange(4.0)
    pg.alltoall_base(torch.empty(4), x, None, None, None)
    pg._allgather_base(torch.empty(8), x, None)
    pg._reduce_scatter_base(torch.empty(2), x, None)
    assert seen == ["a2a", "gather", "scatter"]


def test_the_rank_check_costs_no_collective(device, monkeypatch):
    """The refusal is host-side: nothing reaches the group's collectives."""
    calls = []
    for name in ("all_to_all_single", "all_gather_single", "reduce_scatter_single"):
        monkeypatch.setattr(MirrorGroup, name, lambda *a, _n=name, **k: calls.append(_n))
    outs, lses = partials(1, 2, 4, 8, torch.float16, seed=1, device=device)
    with pytest.raises(ValueError, match="rank_in_group=0 but this process is rank 1"):
        lse_reduce(outs[0], lses[0], Group(2, 0, MirrorGroup(2, 1)), check_ranks=True)
    assert calls == []


class _Disagreeing(MirrorGroup):
    """A mirror whose peers' call differs from this rank's in one field (their all-gathered
    call descriptions carry ``peer_value`` at ``field``)."""

    def __init__(self, n, r, field, peer_value):
        super().__init__(n, r)
        self.field, self.peer_value = field, peer_value

    def all_gather_single(self, output, input, opts=None):
        work = super().all_gather_single(output, input, opts)
        rows = output.view(self.size(), -1)
        rows[0, self.field] = self.peer_value  # rank 0 made another call
        return work


@pytest.mark.parametrize("field, value, named", [
    (0, 5, "B: 5 on rank 0; 2 on rank 1"), (2, 48, "D: 48 on rank 0; 8 on rank 1"),
    (3, 2, "dtype: float32 on rank 0; float16 on rank 1"),
    (4, 0, "LSE base: 2 on rank 0; e on rank 1"),
    (5, 2, "backend: ag_rs on rank 0; packed on rank 1")])
def test_ranks_that_disagree_are_named_with_the_field(device, field, value, named):
    outs, lses = partials(1, 2, 4, 8, torch.float16, seed=1, device=device)
    group = Group(2, 1, _Disagreeing(2, 1, field, value))
    with pytest.raises(ValueError, match="disagree") as e:
        lse_reduce(outs[0], lses[0], group, check_ranks=True)
    assert named in str(e.value)
    assert lse_reduce(outs[0], lses[0], group, check_ranks=False).shape == (2, 2, 8)


def test_the_rank_check_is_off_by_default_and_on_by_environment(device, monkeypatch):
    outs, lses = partials(1, 2, 4, 8, torch.float16, seed=1, device=device)
    group = Group(2, 1, _Disagreeing(2, 1, 2, 48))
    monkeypatch.delenv(CHECK_RANKS_ENV, raising=False)
    lse_reduce(outs[0], lses[0], group)  # off: the decode path pays no collective
    monkeypatch.setenv(CHECK_RANKS_ENV, "1")
    with pytest.raises(ValueError, match="D: 48 on rank 0"):
        lse_reduce(outs[0], lses[0], group)
    with pytest.raises(TypeError, match="check_ranks must be a bool"):
        lse_reduce(outs[0], lses[0], group, check_ranks="yes")

