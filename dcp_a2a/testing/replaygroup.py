"""N ranks with different partials in one process, one rank after another: any implementation's
``lse_reduce`` over a group whose collectives answer with what the other ranks sent.

:func:`run_ranks` calls ``call(group)`` for rank 0, 1, ..., N-1 in turn, each with a
:class:`ReplayGroup` (a ``torch.distributed.ProcessGroup``, passed to the public collectives
like any group). A rank's k-th collective records what it sends and answers with what every
rank sent in its k-th collective of the previous pass (the first pass answers zeros); passes
repeat until every rank sends exactly what it sent in the pass before, and then each rank has
received exactly what real ranks would have exchanged:

    all_to_all_single   recv[src] = send_of_src[me]
    all_gather          out[src] = in_of_src
    reduce_scatter      out = sum over src, in rank order in the dtype, of in_of_src[me]

An exchange whose sends depend on what was received (ag_rs's reduce-scatter after its
all-gather) settles in one more pass. Sends that never settle (a nondeterministic
implementation) or ranks that disagree on their collectives are an AssertionError naming the
rank and the collective. Every rank's collectives are logged (:class:`Sent`: kind, dtype,
shape, bytes), which is how the up-projection clause sees the lanes a head on the wire.

What it cannot see: anything that depends on the ranks running at once (a rank waiting for a
signal another rank's kernel sets: symm_mem); real process groups stay the reference for those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .mirror import MirrorGroup, _Done


@dataclass(frozen=True)
class Sent:
    """One collective a rank issued: its kind, what it sent (dtype, shape) and its bytes."""

    kind: str
    dtype: torch.dtype
    shape: tuple
    nbytes: int


class ReplayGroup(MirrorGroup):
    """Rank ``rank`` of ``size``, answering each collective from ``previous`` (what every
    rank sent in the pass before: ``previous[src][k]``) and recording its own sends."""

    def __init__(self, size: int, rank: int, previous: list[list[torch.Tensor]]):
        super().__init__(size, rank)
        self.previous = previous
        self.sent: list[torch.Tensor] = []
        self.log: list[Sent] = []

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "replay"

    def _record(self, kind: str, t: torch.Tensor) -> tuple[int, list]:
        k = len(self.sent)
        self.sent.append(t.detach().clone())
        self.log.append(Sent(kind, t.dtype, tuple(t.shape), t.numel() * t.element_size()))
        theirs = [p[k] if k < len(p) else None for p in self.previous]
        return k, theirs

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          opts=None):
        n, r = self._n, self._r
        for name, split, t in (("output", output_split_sizes, output),
                               ("input", input_split_sizes, input)):
            if split and (len(split) != n or len(set(split)) != 1 or sum(split) != t.shape[0]):
                raise ValueError(f"ReplayGroup.all_to_all_single: {name}_split_sizes {split} "
                                 f"are not {n} equal slices of dim 0 ({t.shape[0]})")
        _, theirs = self._record("all_to_all_single", input)
        dst = output.view(n, -1)
        for src, sent in enumerate(theirs):
            if sent is None or sent.numel() != input.numel():
                dst[src].zero_()
            else:
                dst[src].copy_(sent.reshape(n, -1)[r])
        return _Done(output)

    def all_gather_single(self, output, input, opts=None):
        _, theirs = self._record("all_gather", input)
        dst = output.view(self._n, -1)
        for src, sent in enumerate(theirs):
            if sent is None or sent.numel() != input.numel():
                dst[src].zero_()
            else:
                dst[src].copy_(sent.reshape(-1))
        return _Done(output)

    def reduce_scatter_single(self, output, input, opts=None):
        _, theirs = self._record("reduce_scatter", input)
        flat = output.view(-1)
        flat.zero_()
        for src, sent in enumerate(theirs):
            if sent is not None and sent.numel() == input.numel():
                part = sent.reshape(self._n, -1)[self._r]
                if src == 0:
                    flat.copy_(part)
                else:
                    flat.add_(part)
        return _Done(output)

    # the list forms and the rest are not modelled: a call is an error, never a silent answer
    def _not_modelled(self, *args, **kwargs):
        raise NotImplementedError("ReplayGroup models all_to_all_single, all_gather (into a "
                                  "tensor) and reduce_scatter (from a tensor) only")

    allgather = alltoall = reduce_scatter = allreduce = broadcast = _not_modelled


def run_ranks(size: int, call: Callable, *, max_passes: int = 4):
    """``([call(group of rank r) for r in range(size)], [rank r's Sent log])``, where
    ``group`` is ``dcp_a2a.Group(size, r, ReplayGroup(...))`` (see the module). ``call`` must
    make the same collectives on every pass (it is called once per rank and pass)."""
    from dcp_a2a import Group

    previous: list[list[torch.Tensor]] = [[] for _ in range(size)]
    for _ in range(max_passes):
        groups = [ReplayGroup(size, r, previous) for r in range(size)]
        results = [call(Group(size, r, g)) for r, g in enumerate(groups)]
        kinds = {tuple(s.kind for s in g.log) for g in groups}
        if len(kinds) > 1:
            raise AssertionError("the ranks issued different collectives: "
                                 + "; ".join(f"rank {r}: {[s.kind for s in g.log]}"
                                             for r, g in enumerate(groups)))
        sent = [g.sent for g in groups]
        if all(len(p) == len(s) and all(_same(a, b) for a, b in zip(p, s))
               for p, s in zip(previous, sent)):
            return results, [g.log for g in groups]
        previous = sent
    raise AssertionError(f"the ranks' sends did not settle in {max_passes} passes: each pass "
                         "sent other bits for the same inputs (a nondeterministic exchange?)")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
