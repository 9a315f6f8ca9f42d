"""The exchange of N ranks simulated in one process.

Runs N ``lse_reduce_steps`` generators in lockstep and answers each collective from the
payloads of all N (an all-to-all is a transpose of the per-rank buffers). Used by the tests and
by the end-to-end evals to run every backend's real local work without process groups.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .buffers import StagingBuffers
from .collective import lse_reduce_steps


def _exchange(kind: str, payloads: list):
    n = len(payloads)
    if kind == "all_to_all":
        for r, (_, recv) in enumerate(payloads):
            for src, (send, _) in enumerate(payloads):
                recv[src].copy_(send[r])
        return [recv for _, recv in payloads]
    if kind == "all_to_all_pair":
        parts = [_exchange("all_to_all", [p[i] for p in payloads]) for i in range(2)]
        return [(parts[0][r], parts[1][r]) for r in range(n)]
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
                          query_start_loc=None, backend="packed"):
    """Every rank's ``lse_reduce`` result for per-rank partials ``outs[r]``/``lses[r]``.

    ``seq_lens`` is None or a per-rank sequence of tensors (each rank has its own local KV
    lengths); ``query_start_loc`` is shared by all ranks.
    """
    n = len(outs)
    if len(lses) != n:
        raise ValueError(f"got {n} outputs but {len(lses)} LSEs")
    gens = [
        lse_reduce_steps(outs[r], lses[r], n, r, return_lse=return_lse,
                         is_lse_base_on_e=is_lse_base_on_e,
                         seq_lens=None if seq_lens is None else seq_lens[r],
                         query_start_loc=query_start_loc, backend=backend,
                         buffers=StagingBuffers())
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
