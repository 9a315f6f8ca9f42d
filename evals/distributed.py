"""DCP over a real process group: one process per rank under torchrun, in lockstep.

    torchrun --nproc-per-node N -m dcp_a2a.evals.gsm8k --distributed [options]

Every rank loads the model on its own device (NCCL with rank r on cuda:LOCAL_RANK where CUDA
is available, else gloo on the CPU; ``--process-group gloo`` with CUDA: gloo between ranks on
the GPUs, see :func:`rank_device`) and holds only its shard of the KV cache (token
interleave: :class:`evals.kv_cache.DCPShardedCache`). At every decode step each rank
computes the partial attention over its shard and merges it with ``dcp_a2a.lse_reduce`` on the
real group (then all-gathers the head slices: the next layer needs every head).

How the ranks stay in lockstep: rank 0 alone runs lm-eval (reads the data, builds the 5-shot
requests, scores, writes results). Each generate call it makes is broadcast first -- the
padded token batch, ``max_length``, the stop strings and the generation kwargs -- and every
other rank, in :func:`serve`, makes the same call on the received batch. So the ranks cannot
disagree on which calls are made or on their inputs, whatever lm-eval does (request order,
batching, hash seeds); lm-eval on every rank would need all of that to be deterministic across
processes. Inside a call, the stop decision depends on the tokens: rank 0's greedy token of
every step is broadcast (a logits processor) and every rank continues with it, so all ranks
stop at the same step. The ranks compute bitwise the same logits (identical inputs, and the
merged attention is all-gathered), so this forces nothing in practice; each rank counts the
steps where its own argmax differed (``rank_token_mismatches`` in the results, 0 expected).
Greedy decoding only (GSM8K's task is greedy).

Commands rank 0 broadcasts (``broadcast_object_list``): ``backend`` (switch the model's DCP
backend), ``generate``, ``mismatches`` (sum the counters), ``done``, ``abort`` (rank 0 failed
outside a collective: the others exit with an error instead of waiting).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class RankContext:
    """This process's place in the DCP group."""

    rank: int
    world_size: int
    local_rank: int
    device: str
    pg_backend: str      # "nccl" or "gloo"
    group: Any           # dcp_a2a.Group over the default process group
    mismatches: int = 0  # decode steps (x rows) where this rank's argmax differed from rank 0's
    in_generate: bool = False  # rank 0: a generate call (and its collectives) is under way

    def describe(self) -> dict:
        return {"world_size": self.world_size, "process_group": self.pg_backend,
                "device_rank0": self.device}


def torchrun_rank() -> int | None:
    """RANK from torchrun's environment, None outside torchrun."""
    r = os.environ.get("RANK")
    return int(r) if r is not None and "WORLD_SIZE" in os.environ else None


PROCESS_GROUPS = ("auto", "nccl", "gloo")


def rank_device(local_rank: int, process_group: str, n_gpus: int) -> tuple[str, str]:
    """``(device, backend)`` of the rank with this LOCAL_RANK.

    ``auto``: NCCL on cuda:LOCAL_RANK where CUDA is available, else gloo on the CPU. ``nccl``
    needs a GPU per rank. ``gloo`` with CUDA puts rank r on cuda:(LOCAL_RANK mod GPUs): gloo
    stages each collective's CUDA tensors through host memory, so ranks may share a GPU, which
    NCCL refuses. That runs the multi-rank path (real processes, a real group, the compiled
    kernels) on a machine with fewer GPUs than ranks; its speed says nothing of NCCL's.
    """
    if process_group not in PROCESS_GROUPS:
        raise ValueError(f"process group {process_group!r}: expected one of "
                         f"{', '.join(PROCESS_GROUPS)}")
    asked = process_group
    if process_group == "auto":
        process_group = "nccl" if n_gpus else "gloo"
    if process_group == "nccl":
        if local_rank >= n_gpus:
            raise ValueError(f"NCCL (--process-group {asked}) needs a GPU per rank: LOCAL_RANK "
                             f"{local_rank} but {n_gpus} GPU(s) visible (ranks cannot share a "
                             "GPU under NCCL; --process-group gloo lets them)")
        return f"cuda:{local_rank}", "nccl"
    return (f"cuda:{local_rank % n_gpus}" if n_gpus else "cpu"), "gloo"


def init_from_env(process_group: str = "auto") -> RankContext:
    """Join the process group torchrun set up (its environment variables), of the kind
    :func:`rank_device` picks. A rank killed by a signal (SIGABRT, SIGSEGV, ...) prints every
    thread's Python stack (faulthandler)."""
    import faulthandler

    import torch.distributed as dist

    faulthandler.enable()

    from dcp_a2a import Group

    if torchrun_rank() is None:
        raise RuntimeError("--distributed runs under torchrun (RANK and WORLD_SIZE unset): "
                           "torchrun --nproc-per-node N -m dcp_a2a.evals.gsm8k --distributed")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device, backend = rank_device(local, process_group, n_gpus)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=torch.device(device))
    else:
        dist.init_process_group(backend)
    g = Group.from_process_group()
    return RankContext(g.rank_in_group, g.world_size, local, device, backend, g)


def command(ctx: RankContext, name: str | None = None, payload=None):
    """Rank 0 sends ``(name, payload)``; every rank returns it."""
    import torch.distributed as dist

    box = [(name, payload)] if ctx.rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _follow_rank0(ctx: RankContext):
    """A logits processor that replaces the scores by a one-hot of rank 0's argmax (broadcast)
    and counts the rows where this rank's own argmax differs."""
    import torch.distributed as dist
    from transformers import LogitsProcessor

    class FollowRank0(LogitsProcessor):
        def __call__(self, input_ids, scores):
            mine = scores.argmax(dim=-1)
            chosen = mine.clone()
            dist.broadcast(chosen, src=0)
            ctx.mismatches += int((mine != chosen).sum())
            forced = torch.full_like(scores, -torch.inf)
            return forced.scatter_(-1, chosen[:, None], 0.0)

    return FollowRank0()


def _generate(lm, context, max_length, stop, generation_kwargs):
    """HFLM's generate on this rank, with the rank's KV shard and rank 0's tokens."""
    from lm_eval.models.huggingface import HFLM
    from transformers import LogitsProcessorList

    from .kv_cache import DCPShardedCache, PreallocatedCache

    ctx = lm.dcp_rank
    kw = dict(generation_kwargs)
    if kw.get("do_sample"):
        raise ValueError("--distributed decodes greedily (do_sample=False): rank 0's token is "
                         "what every rank continues with")
    kw["logits_processor"] = LogitsProcessorList([_follow_rank0(ctx)])
    settings = lm.dcp_settings
    if settings is not None:
        cfg = lm.model.config.get_text_config()
        settings.kv_cache = DCPShardedCache(cfg.num_hidden_layers, ctx.rank, ctx.world_size,
                                            settings.interleave)
        kw["past_key_values"] = settings.kv_cache
    elif getattr(lm, "kv_cache", "dynamic") == "preallocated":  # the unsharded reference
        cache = PreallocatedCache(lm.model.config, max_length)
        if cache is not None:
            kw["past_key_values"] = cache
    try:
        with warnings.catch_warnings():  # past_key_values= (see DCPHFLM._model_generate)
            warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated",
                                    category=FutureWarning)
            return HFLM._model_generate(lm, context, max_length, stop, **kw)
    finally:
        if settings is not None:
            settings.kv_cache = None


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def lead_generate(lm, context, max_length, stop, generation_kwargs):
    """Rank 0: broadcast the call, then make it (DCPHFLM._model_generate under torchrun)."""
    ctx = lm.dcp_rank
    ctx.in_generate = True
    command(ctx, "generate", _to((context, max_length, list(stop), generation_kwargs), "cpu"))
    out = _generate(lm, context, max_length, stop, generation_kwargs)
    ctx.in_generate = False
    return out


def set_backend(lm, backend: str) -> None:
    """Rank 0: switch every rank's model to ``backend``."""
    command(lm.dcp_rank, "backend", backend)
    lm.set_backend(backend)


def sum_mismatches(lm) -> int:
    """Rank 0: the rank-token mismatches of all ranks since the last call (and reset them)."""
    command(lm.dcp_rank, "mismatches")
    return _sum_mismatches(lm.dcp_rank)


def _sum_mismatches(ctx: RankContext) -> int:
    import torch.distributed as dist

    t = torch.tensor([ctx.mismatches], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t)
    ctx.mismatches = 0
    return int(t.item())


def finish(lm, error: BaseException | None = None) -> None:
    """Rank 0: release the other ranks from :func:`serve` (``abort`` after a failure). A
    failure inside a generate call sends nothing: the other ranks are inside some collective
    of that call, and a broadcast now would be matched against it; rank 0 exits and torchrun
    stops them."""
    if error is None:
        command(lm.dcp_rank, "done")
    elif not lm.dcp_rank.in_generate:
        command(lm.dcp_rank, "abort", f"{type(error).__name__}: {error}")


def leave(clean: bool) -> None:
    """Every rank: leave the process group. After a clean run the ranks first meet at a
    barrier, so that none tears its transport down while a peer's last collective (rank 0's
    ``done``) is still in flight. After a failure there is no barrier: a peer may be inside
    another collective, or gone. What is left of the group goes at exit
    (:func:`exit_if_left_cleanly`)."""
    import torch.distributed as dist

    global _left_cleanly
    if clean:
        dist.barrier()
    dist.destroy_process_group()
    _left_cleanly = clean


_left_cleanly = False


def exit_if_left_cleanly() -> None:
    """After a clean run (:func:`leave` with ``clean``), end the process now, with status 0
    and without the interpreter's finalization. ``destroy_process_group`` leaves the gloo
    process group object alive (torch 2.13, 2 gloo ranks: 11 references to it after the run
    and a ``gc.collect()``, none from a Python object), so it and gloo's threads are torn down
    in finalization. A rank aborted twice in CI after its work was done ("terminate called
    without an active exception", SIGABRT; once after the barrier of :func:`leave` was added),
    most likely there: pytorch/pytorch#179291 describes a gloo group torn down in finalization
    crashing so (34 runs here did not reproduce it).
    Everything the run writes is closed by then; stdout and stderr are flushed here. Otherwise
    a no-op."""
    if _left_cleanly:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def serve(lm) -> None:
    """Ranks > 0: make every call rank 0 broadcasts until ``done``."""
    ctx = lm.dcp_rank
    while True:
        name, payload = command(ctx)
        if name == "generate":
            context, max_length, stop, kw = _to(payload, ctx.device)
            _generate(lm, context, max_length, stop, kw)
        elif name == "backend":
            lm.set_backend(payload)
        elif name == "mismatches":
            _sum_mismatches(ctx)
        elif name == "done":
            return
        elif name == "abort":
            raise RuntimeError(f"rank 0 failed: {payload}")
        else:
            raise RuntimeError(f"unknown command from rank 0: {name!r}")
