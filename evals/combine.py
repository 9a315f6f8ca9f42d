"""Merging the N simulated ranks' partials (single process), and one rank's merge over a real
process group.

Inputs, stacked over the ranks (what :func:`evals.dcp_attention.dcp_attention` computes):
``outs[N, R, Hp, D]`` (wire dtype), ``lses[N, R, Hp]`` float32, ``seq_lens[N, R]`` int32 (each
rank's local KV length per row; 0 = empty shard), ``qsl[R + 1]`` int32 (every row its own
request). Hp is a multiple of N; rank r ends with heads ``[r*Hp/N, (r+1)*Hp/N)``. Result: the
merged ``[R, Hp, D]`` (every rank's heads, concatenated), in the wire dtype.

Batched over the ranks: the ``packed`` wire path (Triton kernels, or the pure-PyTorch contract
of ``dcp_a2a.reference``) packs every rank's rows in one ``pack_send`` call, as if the N ranks'
R rows were one rank's N*R rows: ``send[p, s*R + r]`` is what rank s sends peer p for row r,
so peer p's receive buffer of the all-to-all, ``recv_p[s, r] = send_s[p, r]``, is
``send[p]`` viewed as ``[N, R, ...]``, and all N peers' buffers are one transpose of
``send``. One ``unpack_combine`` merges them all. The kernels and the contract compute each
(row, head) on its own, in rank order 0..N-1 (README: bitwise identical under every launch
configuration), so this gives the bits of N separate ranks -- tests/e2e/test_fast_path.py
checks that against the per-rank path it replaced -- with two kernel launches per layer
instead of 2N launches, N^2 copies and N generators. ``two_collective`` on Triton is batched
alike through the kernels its ``lse_reduce`` step runs (``lse_to_wire``, ``combine_separate``;
tests/e2e/test_fast_path.py holds it to ``lse_reduce_in_process``, so a change of that backend
shows). ``ag_rs`` on the reference path is vectorised the same way (each rank's weighting is
elementwise; the reduce-scatter adds the ranks in order). ``ag_rs`` and ``symm_mem`` on
Triton run every rank's ``lse_reduce`` generator through
``dcp_a2a.inprocess.lse_reduce_in_process`` (ag_rs weights each rank's partial with that
rank's own LSE in the kernel: no batching of the rows keeps its arithmetic).
"""

from __future__ import annotations

import math

import torch


def _rows(n: int, r: int, device) -> torch.Tensor:
    return torch.arange(n * r + 1, dtype=torch.int32, device=device)


def _wire_batched(impl, outs, lses, seq_lens, base_e):
    """packed / two_collective on the reference path, packed on Triton: ``impl`` is
    ``dcp_a2a`` or ``dcp_a2a.reference.contract`` (same pack_send / unpack_combine API)."""
    n, r, hp, d = outs.shape
    hpr = hp // n
    p = impl.lse_pack_dim(outs.dtype)
    send = torch.empty((n, n * r, hpr, d + p), dtype=outs.dtype, device=outs.device)
    impl.pack_send(outs.reshape(n * r, hp, d), lses.reshape(n * r, hp), send, n, hpr, d, p,
                   seq_lens=seq_lens.reshape(n * r), query_start_loc=_rows(n, r, outs.device))
    # recv[s, p*R + row] = send[p, s*R + row]: every peer's receive buffer of the all-to-all
    recv = send.view(n, n, r, hpr, d + p).transpose(0, 1).reshape(n, n * r, hpr, d + p)
    merged = impl.unpack_combine(recv, d, p, False, base_e)  # [N*R, hpr, D], peer-major rows
    return merged.view(n, r, hpr, d).transpose(0, 1).reshape(r, hp, d)


def _two_collective_batched(outs, lses, seq_lens, base_e):
    """two_collective on Triton, every rank at once: the steps of
    ``dcp_a2a.collective._two_collective`` (outputs peer-major, LSEs through ``lse_to_wire``
    with the rows' masks, ``combine_separate`` on what each peer received), the two
    all-to-alls being transposes."""
    from dcp_a2a.kernels.combine import combine_separate
    from dcp_a2a.kernels.pack import lse_to_wire

    n, r, hp, d = outs.shape
    hpr = hp // n
    # data_recv[s, p*R + row] = rank s's output of row for peer p's heads
    data = outs.view(n, r, n, hpr, d).transpose(1, 2).reshape(n, n * r, hpr, d)
    lse_send = torch.empty((n, n * r, hpr), dtype=torch.float32, device=outs.device)
    lse_to_wire(lses.reshape(n * r, hp), lse_send, n, seq_lens.reshape(n * r),
                _rows(n, r, outs.device))  # lse_send[p, s*R + row]
    lse_recv = lse_send.view(n, n, r, hpr).transpose(0, 1).reshape(n, n * r, hpr)
    merged = combine_separate(data, lse_recv, False, base_e)  # [N*R, hpr, D], peer-major
    return merged.view(n, r, hpr, d).transpose(0, 1).reshape(r, hp, d)


def _ref_wire(outs, lses, seq_lens, base_e):
    """packed and two_collective through the reference contract (both merge the same exchanged
    states the same way): the float64 merge rounded once."""
    from dcp_a2a.reference import contract

    return _wire_batched(contract, outs, lses, seq_lens, base_e)


def _ref_ag_rs(outs, lses, seq_lens, base_e):
    """ag_rs in PyTorch: all-gather the LSEs, each rank weights its partial by exp(s_r - g) in
    fp32 and rounds it to the output dtype, the reduce-scatter sums in the output dtype in rank
    order."""
    n, r, hp, d = outs.shape
    gathered = torch.where(seq_lens[..., None] <= 0, -math.inf, lses.to(torch.float32))
    m = gathered.amax(dim=0)
    m_safe = torch.where(m == -math.inf, torch.zeros_like(m), m)
    ex = torch.exp if base_e else torch.exp2
    log = torch.log if base_e else torch.log2
    total = ex(gathered - m_safe).sum(dim=0)
    g = torch.where(total > 0, m_safe + log(torch.where(total > 0, total, 1.0)),
                    torch.full_like(m, -math.inf))
    g_safe = torch.where(g == -math.inf, torch.zeros_like(g), g)
    w = torch.where(gathered == -math.inf, torch.zeros_like(gathered), ex(gathered - g_safe))
    y = torch.where(w[..., None] > 0, w[..., None] * outs.to(torch.float32), 0.0)
    scaled = y.to(outs.dtype)  # [N src, R, Hp, D]; heads [d*Hp/N, ...) go to rank d
    acc = scaled[0].clone()
    for src in range(1, n):  # the reduce-scatter: one rounding per addition, rank order
        acc += scaled[src]
    return acc


# symm_mem moves the packed wire format and merges it with the packed combine
_REFERENCE = {"packed": _ref_wire, "two_collective": _ref_wire, "ag_rs": _ref_ag_rs,
              "symm_mem": _ref_wire}


def combine_partials(outs, lses, seq_lens, settings) -> torch.Tensor:
    """The merged ``[R, Hp, D]`` of the N simulated ranks (see the module docstring) with
    ``settings.backend`` through ``settings.combine_for(device)``."""
    if settings.combine_for(outs.device) != "triton":
        return _REFERENCE[settings.backend](outs, lses, seq_lens, settings.base_e)
    if settings.backend == "packed":
        import dcp_a2a

        return _wire_batched(dcp_a2a, outs, lses, seq_lens, settings.base_e)
    if settings.backend == "two_collective":
        return _two_collective_batched(outs, lses, seq_lens, settings.base_e)
    from dcp_a2a.inprocess import lse_reduce_in_process

    n, r = outs.shape[:2]
    res = lse_reduce_in_process(list(outs.unbind(0)), list(lses.unbind(0)), return_lse=False,
                                is_lse_base_on_e=settings.base_e,
                                seq_lens=list(seq_lens.unbind(0)),
                                query_start_loc=_rows(1, r, outs.device),
                                backend=settings.backend)
    return torch.cat(res, dim=1)


def _symm_buffers(settings, out):
    from dcp_a2a import SymmMemBuffers

    R, H, D = out.shape
    key = (H, D, out.dtype)
    bufs = settings.symm_buffers.get(key)
    if bufs is None or bufs.tables.max_tokens < R:  # every rank has the same R: collective
        bufs = SymmMemBuffers(settings.group, max_tokens=max(R, 1), num_heads=H, head_dim=D,
                              dtype=out.dtype, device=out.device)
        settings.symm_buffers[key] = bufs
    return bufs


def combine_distributed(out, lse, seq_lens, settings) -> torch.Tensor:
    """One rank of a real group: ``dcp_a2a.lse_reduce`` of its partial ``out[R, Hp, D]`` /
    ``lse[R, Hp]`` (local KV lengths ``seq_lens[R]``), then the head slices all-gathered:
    ``[R, Hp, D]``."""
    import torch.distributed as dist

    from dcp_a2a import lse_reduce

    kw = {}
    if settings.backend == "symm_mem":
        kw["buffers"] = _symm_buffers(settings, out)
    mine = lse_reduce(out, lse, settings.group, return_lse=False,
                      is_lse_base_on_e=settings.base_e, seq_lens=seq_lens,
                      query_start_loc=_rows(1, out.shape[0], out.device),
                      backend=settings.backend, **kw)
    n = settings.world_size
    R, hpr, D = mine.shape
    # rank-major along dim 0 (gloo checks each rank's chunk against the input's shape)
    gathered = torch.empty((n * R, hpr, D), dtype=mine.dtype, device=mine.device)
    # torch >= 2.13 renames all_gather_into_tensor (and warns on the old name)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(gathered, mine.contiguous(), group=settings.group.device_group)
    return gathered.view(n, R, hpr, D).permute(1, 0, 2, 3).reshape(R, n * hpr, D)
