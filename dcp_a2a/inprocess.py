"""The exchange of N ranks simulated in one process: the one home of the in-process
collectives.

:func:`all_to_all` is the exchange itself (``recv_r[src] = send_src[r]``, a transpose of the
per-rank buffers); :func:`lse_reduce_in_process` runs N ``lse_reduce_steps`` generators in
lockstep and answers each collective they yield from the payloads of all N. Used by the tests,
the conformance harness (any implementation's ``pack_send`` / ``unpack_combine``) and the
end-to-end evals to run every backend's real local work without process groups.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .buffers import StagingBuffers
from .collective import lse_reduce_steps
from .symm_mem import SymmMemBuffers


def _same_across_ranks(what: str, tensors: Sequence, fields=("shape", "dtype", "device")
                       ) -> None:
    """Every rank's ``tensors[r]`` a tensor with rank 0's shape, dtype and device: ValueError
    naming the first rank and field that differ (TypeError for a rank's non-tensor). What one
    process's ranks hold must match as real ranks' calls must."""
    for r, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rank {r}'s {what} must be a torch.Tensor, got {type(t).__name__}")
    for r, t in enumerate(tensors[1:], start=1):
        for field in fields:
            mine, first = getattr(t, field), getattr(tensors[0], field)
            if mine != first:
                show = tuple if field == "shape" else str
                raise ValueError(f"rank {r}'s {what} has {field} {show(mine)} but rank 0's has "
                                 f"{show(first)}: every rank must pass the same {field}")


def all_to_all(sends: Sequence[torch.Tensor], recvs: Sequence[torch.Tensor] | None = None
               ) -> list[torch.Tensor]:
    """Every rank's receive buffer: ``recvs[r][src] = sends[src][r]`` (each ``[N, ...]``).
    Written into ``recvs`` when given, else into fresh contiguous tensors.

    Every send (and recv) has one shape, dtype and device, with N slices on its first axis:
    anything else is a ValueError naming the rank and the field (a rank with more slices than
    there are ranks would leave part of a receive buffer unwritten)."""
    n = len(sends)
    _same_across_ranks("send buffer", sends)
    if n and (sends[0].dim() < 1 or sends[0].shape[0] != n):
        raise ValueError(
            f"rank 0's send buffer has shape {tuple(sends[0].shape)}: its first axis must "
            f"hold one slice per rank, {n}")
    if recvs is not None:
        if len(recvs) != n:
            raise ValueError(f"got {n} ranks' send buffers but {len(recvs)} receive buffers")
        _same_across_ranks("receive buffer", recvs)
        for field in ("shape", "dtype", "device"):
            if n and getattr(recvs[0], field) != getattr(sends[0], field):
                show = tuple if field == "shape" else str
                raise ValueError(
                    f"rank 0's receive buffer has {field} {show(getattr(recvs[0], field))} but "
                    f"the send buffers have {show(getattr(sends[0], field))}")
    if recvs is None:
        recvs = [torch.empty_like(sends[r], memory_format=torch.contiguous_format)
                 for r in range(n)]
    for r, recv in enumerate(recvs):
        for src, send in enumerate(sends):
            recv[src].copy_(send[r])
    return list(recvs)


def _exchange(kind: str, payloads: list):
    n = len(payloads)
    if kind == "all_to_all":
        return all_to_all([s for s, _ in payloads], [r for _, r in payloads])
    if kind == "all_to_all_pair":
        parts = [_exchange("all_to_all", [p[i] for p in payloads]) for i in range(2)]
        return [(parts[0][r], parts[1][r]) for r in range(n)]
    if kind == "peers_signalled":  # the direct kernels exchanged already: nothing to move
        return [None] * n
    if kind == "all_gather":
        for _, gathered in payloads:
            for src, (local, _) in enumerate(payloads):
                gathered[src].copy_(local)
        return [g for _, g in payloads]
    if kind == "reduce_scatter":
        # sum in the payload dtype in rank order, as a ring/tree collective does (one rounding
        # per addition in the output dtype)
        out = []
        for r, (_, merged) in enumerate(payloads):
            acc = payloads[0][0][r].clone()
            for src in range(1, n):
                acc += payloads[src][0][r]
            merged.copy_(acc)
            out.append(merged)
        return out
    raise AssertionError(f"unknown step {kind}")


def lse_reduce_in_process(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor], *,
                          return_lse=False, is_lse_base_on_e=True, seq_lens=None,
                          query_start_loc=None, backend="packed", buffers=None, into=None,
                          w_uv=None, up_proj="auto"):
    """Every rank's ``lse_reduce`` result for per-rank partials ``outs[r]``/``lses[r]``.

    ``seq_lens`` is None or a per-rank sequence of tensors (each rank has its own local KV
    lengths); ``query_start_loc`` is shared by all ranks. ``buffers``: per-rank buffers to
    reuse across calls (``SymmMemBuffers.in_process(...)`` for symm_mem); default fresh ones.
    ``into``: None or a per-rank sequence of result buffers; ``w_uv`` (shared by the ranks)
    and ``up_proj``: the up-projection, as ``lse_reduce`` takes them.
    """
    n = len(outs)
    if len(lses) != n:
        raise ValueError(f"got {n} outputs but {len(lses)} LSEs")
    # ranks of one call hold partials of one shape: checked here, naming the rank, rather than
    # failing in an exchange between tensors of different sizes
    _same_across_ranks("out", outs)
    _same_across_ranks("lse", lses)
    if seq_lens is not None and len(seq_lens) != n:
        raise ValueError(f"got {n} ranks' partials but {len(seq_lens)} ranks' seq_lens "
                         "(one tensor a rank)")
    if into is not None and len(into) != n:
        raise ValueError(f"got {n} ranks' partials but {len(into)} ranks' into buffers "
                         "(one a rank)")
    if buffers is not None:
        if len(buffers) != n:
            raise ValueError(f"got {n} ranks' partials but {len(buffers)} ranks' buffers")
    elif backend == "symm_mem" and n:
        B, H, D = outs[0].shape
        if isinstance(w_uv, torch.Tensor) and w_uv.dim() == 3:  # the width the order carries
            from .up_projection import choose

            order = choose(up_proj, B, n, outs[0].device, H, D, w_uv.shape[2], outs[0].dtype)
            D = D if order == "after_merge" else w_uv.shape[2]
        buffers = SymmMemBuffers.in_process(n, max_tokens=max(B, 1), num_heads=max(H, n),
                                            head_dim=D, dtype=outs[0].dtype,
                                            device=outs[0].device)
    else:
        buffers = [StagingBuffers() for _ in range(n)]
    gens = [
        lse_reduce_steps(outs[r], lses[r], n, r, return_lse=return_lse,
                         is_lse_base_on_e=is_lse_base_on_e,
                         seq_lens=None if seq_lens is None else seq_lens[r],
                         query_start_loc=query_start_loc, backend=backend,
                         buffers=buffers[r], into=None if into is None else into[r],
                         w_uv=w_uv, up_proj=up_proj)
        for r in range(n)
    ]
    reqs = [next(g) for g in gens] if n else []
    results: list = [None] * n
    live = list(range(n))
    while live:
        kinds = {reqs[r][0] for r in live}
        if len(kinds) != 1:
            raise RuntimeError(f"ranks disagree on the next collective: {sorted(kinds)}")
        answers = _exchange(kinds.pop(), [reqs[r][1] for r in live])
        still = []
        for r, ans in zip(live, answers):
            try:
                reqs[r] = gens[r].send(ans)
                still.append(r)
            except StopIteration as done:
                results[r] = done.value
        if still and len(still) != len(live):
            raise RuntimeError("ranks finished after different numbers of collectives")
        live = still
    return results
