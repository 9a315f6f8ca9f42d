"""A process group of N simulated ranks in one process, for graph and buffer scenarios at
N = 2, 4, 8 on a single GPU (or the CPU).

:class:`MirrorGroup` is a ``torch.distributed.ProcessGroup`` (a Python subclass, passed to the
public ``torch.distributed`` collectives like any group) standing for rank ``r`` of a group of
``N`` ranks that all hold the same partials. Each collective is then a device copy on the
current stream, so it can be captured in a CUDA graph:

    all_to_all(_single)          recv[s] = send[r] for every s   (rank s sent what rank r
                                 sends: the same)
    all_gather(_into_tensor)     out[s] = in for every s
    reduce_scatter(_tensor)      out = in[r] summed N times      (in the dtype, rank order)
    all_reduce                   SUM: x summed N times; MAX, MIN, AVG: x
    broadcast, barrier           nothing to do (every rank holds the same)

A collective it does not model raises (the scenario then reports the error; an implementation
is never judged on a collective the group cannot simulate silently).

Every implementation's staging is exercised as on a real group of N (an implementation that
passes a group of one straight through packs and exchanges here), and the expected merge is
known exactly: N equal partials merge to the slice itself, with LSE = lse + log N (log2 N in
base 2). What it cannot see: a peer-mapping bug (every slice is equal), so real gloo and NCCL
groups stay the reference for those.

Usage: ``Group(n, r, MirrorGroup(n, r))`` (or any object with world_size, rank_in_group and
device_group). ``torch.distributed`` needs no ``init_process_group`` for it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.futures import Future


class _Done(dist.Work):
    """The work of a collective that was queued on the current stream when it was called."""

    def __init__(self, result):
        super().__init__()
        self._result = result

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self):
        fut = Future()
        fut.set_result(self._result)
        return fut


class MirrorGroup(dist.ProcessGroup):
    """Rank ``rank`` of ``size`` simulated ranks holding identical partials (see the module)."""

    def __init__(self, size: int, rank: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"MirrorGroup size must be an int >= 1, got {size!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"MirrorGroup rank must be an int in [0, {size}), got {rank!r}")
        super().__init__(rank, size)
        self._n, self._r = size, rank

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "mirror"

    # the collectives, under the names torch >= 2.13 calls and the older ones
    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          opts=None):
        n = self._n
        for name, split, t in (("output", output_split_sizes, output),
                               ("input", input_split_sizes, input)):
            # explicit splits are fine when they are the even ones (N equal slices of dim 0)
            if split and (len(split) != n or len(set(split)) != 1 or sum(split) != t.shape[0]):
                raise ValueError(f"MirrorGroup.all_to_all_single: {name}_split_sizes {split} "
                                 f"are not {n} equal slices of dim 0 ({t.shape[0]})")
        output.view(n, -1).copy_(input.reshape(n, -1)[self._r].expand(n, -1))
        return _Done(output)

    # torch < 2.13's names call the new ones through self, so that a subclass (a test's
    # disagreeing peer, a monkeypatch) overrides one method and both versions see it
    def alltoall_base(self, output, input, output_split_sizes=None, input_split_sizes=None,
                      opts=None):
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                      opts)

    def all_gather_single(self, output, input, opts=None):
        output.view(self._n, -1).copy_(input.reshape(1, -1).expand(self._n, -1))
        return _Done(output)

    def _allgather_base(self, output, input, opts=None):
        return self.all_gather_single(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        part = input.reshape(self._n, -1)[self._r]
        flat = output.view(-1)
        flat.copy_(part)
        for _ in range(self._n - 1):  # the sum of N equal terms, in the dtype, as a ring would
            flat.add_(part)
        return _Done(output)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter_single(output, input, opts)

    # the list forms (torch.distributed.all_gather, all_to_all, reduce_scatter) and the rest
    def allgather(self, output_lists, inputs, opts=None):
        for outs, inp in zip(output_lists, inputs):
            for o in outs:
                o.copy_(inp)
        return _Done(output_lists)

    def alltoall(self, outputs, inputs, opts=None):
        for o in outputs:
            o.copy_(inputs[self._r])
        return _Done(outputs)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        for o, inps in zip(outputs, input_lists):
            self.reduce_scatter_single(o, torch.stack(list(inps)))
        return _Done(outputs)

    def allreduce(self, tensors, opts=None):
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        op = getattr(op, "op", op)  # a ReduceOp holds its RedOpType in .op
        if op == dist.ReduceOp.SUM:
            for t in tensors:
                part = t.clone()
                for _ in range(self._n - 1):
                    t.add_(part)
        elif op not in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.AVG):
            raise ValueError(f"MirrorGroup.allreduce: {op} is not modelled")
        return _Done(tensors)

    def broadcast(self, tensors, opts=None):
        return _Done(tensors)

    def barrier(self, opts=None):
        return _Done(None)
