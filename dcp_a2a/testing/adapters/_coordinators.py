"""The contract's group (``world_size``, ``rank_in_group``, ``device_group``) seen as an engine's
group coordinator: the few collective methods an engine's DCP combine calls on it, each one
``torch.distributed`` call over ``device_group`` with the semantics of the engine's own
coordinator (read from its release: vLLM's ``DeviceCommunicatorBase``, SGLang's
``GroupCoordinator``). None of them computes anything: they move bytes between the ranks, as
the engine's coordinator does on a process group without its custom communicators, so they
cannot change an engine's numbers. Attributes are read only when the engine asks for them (a
group of one has no process group to read)."""

from __future__ import annotations

import torch


def _dist():
    import torch.distributed as dist

    return dist


def _all_gather_into(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    dist = _dist()
    # torch >= 2.13 renames all_gather_into_tensor (and warns on the old name)
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def _reduce_scatter_into(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    dist = _dist()
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp, group=group)


class _Coordinator:
    """What every engine's coordinator has: the group's size, this rank and the process group."""

    engine = "the engine"

    def __init__(self, group):
        self._group = group
        self.world_size = group.world_size
        self.rank_in_group = group.rank_in_group

    @property
    def device_group(self):
        return self._group.device_group

    @property
    def cpu_group(self):
        return getattr(self._group, "cpu_group", self._group.device_group)

    @property
    def ranks(self) -> list[int]:
        """The global ranks of the group, in group order."""
        dist = _dist()
        pg = self._group.device_group
        if dist.is_available() and dist.is_initialized() and pg is not None:
            return list(dist.get_process_group_ranks(pg))
        return list(range(self.world_size))

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return self.ranks[self.rank_in_group]

    def __getattr__(self, name):
        raise AttributeError(f"the {self.engine} adapter's group coordinator has no {name!r}: "
                             f"{self.engine}'s combine asked for more of its coordinator than "
                             "the adapter provides")

    def _gather(self, input_: torch.Tensor, dim: int) -> torch.Tensor:
        """Concatenate every rank's ``input_`` along ``dim`` (group order)."""
        if dim < 0:
            dim += input_.dim()
        size = input_.size()
        out = torch.empty((size[0] * self.world_size,) + size[1:], dtype=input_.dtype,
                          device=input_.device)
        _all_gather_into(out, input_, self.device_group)
        out = out.reshape((self.world_size,) + size).movedim(0, dim)
        return out.reshape(size[:dim] + (self.world_size * size[dim],) + size[dim + 1:])

    def _scatter(self, input_: torch.Tensor, dim: int) -> torch.Tensor:
        """The sum over ranks of ``input_``, this rank's chunk along ``dim`` (a view)."""
        if dim < 0:
            dim += input_.dim()
        inp = input_.movedim(dim, 0).contiguous()
        out = torch.empty((inp.shape[0] // self.world_size,) + inp.shape[1:], dtype=inp.dtype,
                          device=inp.device)
        _reduce_scatter_into(out, inp, self.device_group)
        return out.movedim(0, dim)


class VllmCoordinator(_Coordinator):
    """vLLM's GroupCoordinator, as ``dcp.py`` of vLLM 0.34.0 uses it: ``all_gather`` and
    ``reduce_scatter`` along a dimension (``vllm/distributed/device_communicators/
    base_device_communicator.py``: concatenate; sum and keep this rank's chunk)."""

    engine = "vLLM"

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        return self._gather(input_, dim)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        return self._scatter(input_, dim).contiguous()


class SglangCoordinator(_Coordinator):
    """SGLang's GroupCoordinator, as ``sglang/srt/layers/dcp/comm.py`` of SGLang 0.5.23 uses
    it (``sglang/srt/distributed/parallel_state.py``): ``all_to_all_single(output, input)``,
    ``all_gather`` (concatenate along a dimension), ``all_reduce`` (in place, as on its
    torch.distributed path) and ``reduce_scatter_along_dim``."""

    engine = "SGLang"

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> None:
        if self.world_size == 1:
            output.copy_(input)
            return
        _dist().all_to_all_single(output, input, group=self.device_group)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        return self._gather(input_, dim)

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        _dist().all_reduce(input_, group=self.device_group)
        return input_

    def reduce_scatter_along_dim(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        return self._scatter(input_, dim)
