"""A frozen copy of the simulated-DCP attention path as it was before the speed-up (evals/
dcp_attention.py at commit 50ceb1a): per-rank partials from N masked copies of the score
matrix, per-rank Python lists, the in-process combines (one lse_reduce generator per rank, or
the reference wire path of every rank), and transformers' DynamicCache (no argument to
generate). tests/e2e/test_fast_path.py runs the tiny model through this and through today's
code and requires the same bits: the speed-up must not change a generated token.

Only the functions the decode path runs are copied (verbatim, but for the imports); settings,
masks and the shard owner are today's (unchanged by the speed-up).
"""

from __future__ import annotations

import math

import torch

from dcp_a2a.evals.dcp_attention import DCPSettings, shard_owner  # noqa: F401

_LOG2E = 1.4426950408889634


# Score elements materialised at once by partial_attention (float32: 4 bytes each); ranks are
# processed in chunks that stay under it.
_SCORE_BUDGET = 1 << 26


def partial_attention(query, key, value, visible, scaling: float, base_e: bool,
                      out_dtype: torch.dtype, owner: torch.Tensor | None = None,
                      ranks=None):
    """Attention of ``query[B, Hq, Tq, D]`` over KV shards of ``key/value[B, Hkv, Tk, D]``.

    ``visible[B, 1|Hq, Tq, Tk]`` bool. Without ``owner`` all Tk keys are one shard and the
    result has no rank dimension: ``out[B, Hq, Tq, D]`` (out_dtype, normalised by the local
    softmax sum), ``lse[B, Hq, Tq]`` float32 (base e, or base 2 computed with exp2/log2) and
    ``nkeys[B, Tq]`` (visible local keys per row, any head). With ``owner[Tk]`` (the rank of
    each key, see :func:`shard_owner`) each rank in ``ranks`` (default: all) gets the partial
    over its own keys only -- ``out[Rn, B, Hq, Tq, D]``, ``lse[Rn, B, Hq, Tq]``,
    ``nkeys[Rn, B, Tq]``. Rows without a visible key give out = 0 and lse = -inf (the
    empty-shard identity), never NaN.

    The ranks share one score matrix ``q k^T`` and one ``p v`` product whose rows are
    (head, rank, query) with p = 0 outside the rank's keys: each rank's partial is computed
    over exactly its keys (exp(-inf) = 0 adds nothing), without a gathered copy of the shard --
    the KV cache is read once per call, as SDPA reads it, which is what makes DCP decode cost
    about what unsharded decode costs here.
    """
    B, Hq, Tq, D = query.shape
    Hkv, Tk = key.shape[1], key.shape[2]
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads are not a multiple of {Hkv} KV heads")
    G = Hq // Hkv
    single = owner is None
    if single:
        owner = torch.zeros(Tk, dtype=torch.long, device=query.device)
        ranks = [0]
    elif ranks is None:
        ranks = range(int(owner.max()) + 1 if Tk else 0)
    ranks = list(ranks)
    ct = torch.promote_types(query.dtype, torch.float32)
    q = query.to(ct).reshape(B, Hkv, G * Tq, D)
    k = key.to(ct)
    v = value.to(ct)
    s = torch.matmul(q, k.transpose(-1, -2)) * scaling  # [B, Hkv, G*Tq, Tk]
    if not base_e:
        s = s * _LOG2E
    s = s.reshape(B, Hkv, G, 1, Tq, Tk)
    vis = visible[:, :, None] if visible.shape[1] == 1 else visible.reshape(B, Hkv, G, Tq, Tk)
    vis = vis[:, :, :, None]  # [B, Hkv|1, G|1, 1, Tq, Tk]
    vis_any = visible.any(dim=1)  # [B, Tq, Tk]
    ex = torch.exp if base_e else torch.exp2
    log = torch.log if base_e else torch.log2
    per_rank = max(1, B * Hq * Tq * Tk)
    step = max(1, _SCORE_BUDGET // per_rank)
    outs, lses, nks = [], [], []
    for c in range(0, len(ranks), step):
        chunk = torch.tensor(ranks[c:c + step], device=query.device)
        mine = owner[None, :] == chunk[:, None]  # [Rc, Tk]
        Rc = len(chunk)
        keep = vis & mine[:, None, :]  # [B, Hkv|1, G|1, Rc, Tq, Tk]
        sr = torch.where(keep, s, -math.inf)  # [B, Hkv, G, Rc, Tq, Tk]
        m = sr.amax(dim=-1, keepdim=True) if Tk else torch.full(
            (*sr.shape[:-1], 1), -math.inf, dtype=ct, device=s.device)
        empty = m == -math.inf
        m_safe = torch.where(empty, torch.zeros_like(m), m)
        p = ex(sr - m_safe)  # exactly 0 where masked
        total = p.sum(dim=-1, keepdim=True)
        denom = torch.where(empty, torch.ones_like(total), total)
        o = torch.matmul(p.reshape(B, Hkv, G * Rc * Tq, Tk), v).reshape(B, Hkv, G, Rc, Tq, D)
        o = torch.where(empty, torch.zeros_like(o), o / denom)
        lse = torch.where(empty, torch.full_like(m, -math.inf), m_safe + log(denom))
        outs.append(o.permute(3, 0, 1, 2, 4, 5).reshape(Rc, B, Hq, Tq, D).to(out_dtype))
        lses.append(lse.squeeze(-1).permute(3, 0, 1, 2, 4).reshape(Rc, B, Hq, Tq)
                    .to(torch.float32))
        nks.append((vis_any[None] & mine[:, None, None, :]).sum(dim=-1))  # [Rc, B, Tq]
    out, lse, nk = torch.cat(outs), torch.cat(lses), torch.cat(nks)
    if single:
        return out[0], lse[0], nk[0]
    return out, lse, nk


def _masked_lse(lse: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """float32 LSE with rows of no local KV set to -inf (each row is its own request here)."""
    out = lse.to(torch.float32).clone()
    out[seq_lens <= 0] = -math.inf
    return out


def _ref_wire(outs, lses, seq_lens, qsl, base_e):
    """packed and two_collective through the reference contract (they merge the same exchanged
    states the same way): every rank's pack_send, the all-to-all, unpack_combine."""
    from dcp_a2a.reference import contract
    from dcp_a2a.testing.exchange import merge_all

    return merge_all(contract, torch.stack(outs), torch.stack(lses), return_lse=False,
                     base_e=base_e, seq_lens=seq_lens, query_start_loc=qsl)


def _ref_ag_rs(outs, lses, seq_lens, qsl, base_e):
    n = len(outs)
    R, Hp, D = outs[0].shape
    hpr = Hp // n
    gathered = torch.stack([_masked_lse(s, sl) for s, sl in zip(lses, seq_lens)])  # all-gather
    m = gathered.amax(dim=0)
    m_safe = torch.where(m == -math.inf, torch.zeros_like(m), m)
    ex = torch.exp if base_e else torch.exp2
    log = torch.log if base_e else torch.log2
    total = ex(gathered - m_safe).sum(dim=0)
    g = torch.where(total > 0, m_safe + log(torch.where(total > 0, total, 1.0)),
                    torch.full_like(m, -math.inf))
    g_safe = torch.where(g == -math.inf, torch.zeros_like(g), g)
    scaled = []
    for r in range(n):  # each rank weights its own partial in fp32, rounds to the output dtype
        w = torch.where(gathered[r] == -math.inf, torch.zeros_like(g), ex(gathered[r] - g_safe))
        y = torch.where(w[..., None] > 0, w[..., None] * outs[r].to(torch.float32), 0.0)
        scaled.append(y.to(outs[r].dtype).unflatten(1, (n, hpr)).transpose(0, 1))
    res = []
    for d in range(n):  # reduce-scatter: sum in the output dtype, in rank order
        acc = scaled[0][d].clone()
        for src in range(1, n):
            acc += scaled[src][d]
        res.append(acc)
    return res


# symm_mem moves the packed wire format and merges it with the packed combine
_REFERENCE = {"packed": _ref_wire, "two_collective": _ref_wire, "ag_rs": _ref_ag_rs,
              "symm_mem": _ref_wire}


def combine_partials(outs, lses, seq_lens, query_start_loc, settings: DCPSettings):
    """Merge per-rank partials ``outs[r][R, Hp, D]`` / ``lses[r][R, Hp]`` (Hp % N == 0).

    Returns the merged ``[R, Hp, D]`` (all heads: the per-rank head slices concatenated)."""
    kind = settings.combine_for(outs[0].device)
    if kind == "triton":
        from dcp_a2a.inprocess import lse_reduce_in_process

        res = lse_reduce_in_process(outs, lses, return_lse=False,
                                    is_lse_base_on_e=settings.base_e, seq_lens=seq_lens,
                                    query_start_loc=query_start_loc, backend=settings.backend)
    else:
        res = _REFERENCE[settings.backend](outs, lses, seq_lens, query_start_loc,
                                           settings.base_e)
    return torch.cat(res, dim=1)


def dcp_attention(query, key, value, visible, scaling: float, settings: DCPSettings,
                  layer_idx=None, local_kv: bool = False) -> torch.Tensor:
    """DCP attention of ``query[B, Hq, Tq, D]`` over ``key/value[B, Hkv, Tk, D]``.

    ``local_kv``: key/value are this rank's shard only (``visible`` restricted to them), as a
    process-group rank's :class:`DCPShardedCache` returns them; otherwise the whole sequence,
    sharded here by :func:`shard_owner`. Returns ``[B, Hq, Tq, D]`` in the query dtype."""
    B, Hq, Tq, D = query.shape
    Tk = key.shape[2]
    n = settings.world_size
    wire = settings.wire_dtype or query.dtype
    hp = -(-Hq // n) * n
    R = B * Tq
    qsl = torch.arange(R + 1, dtype=torch.int32, device=query.device)
    if local_kv:
        o_all, s_all, nk_all = (x[None] for x in partial_attention(
            query, key, value, visible, scaling, settings.base_e, wire))
    else:
        owner = shard_owner(Tk, n, settings.interleave, device=query.device)
        ranks = [settings.group.rank_in_group] if settings.group is not None else range(n)
        o_all, s_all, nk_all = partial_attention(query, key, value, visible, scaling,
                                                 settings.base_e, wire, owner=owner,
                                                 ranks=ranks)
    # rows are (request, query) pairs: [Rn, B, Hq, Tq, D] -> [Rn, R, Hq, D]
    o_all = o_all.permute(0, 1, 3, 2, 4).reshape(-1, R, Hq, D)
    s_all = s_all.permute(0, 1, 3, 2).reshape(-1, R, Hq)
    if hp != Hq:  # empty heads: zero output, LSE -inf on every rank
        o_all = torch.cat([o_all, o_all.new_zeros(o_all.shape[0], R, hp - Hq, D)], dim=2)
        s_all = torch.cat([s_all, s_all.new_full((s_all.shape[0], R, hp - Hq), -math.inf)],
                          dim=2)
    outs = list(o_all.unbind(0))
    lses = list(s_all.unbind(0))
    seq_lens = [x.reshape(R).to(torch.int32) for x in nk_all.unbind(0)]
    sent_outs, sent_lses = outs, lses
    if settings.poison_empty:
        sent_outs, sent_lses = [], []
        for o, s, sl in zip(outs, lses, seq_lens):
            o, s = o.clone(), s.clone()
            o[sl <= 0] = math.nan
            s[sl <= 0] = 0.0
            sent_outs.append(o)
            sent_lses.append(s)
    assert settings.group is None, "the frozen copy covers the single-process path"
    merged = combine_partials(sent_outs, sent_lses, seq_lens, qsl, settings)
    if settings.recorder is not None:
        settings.recorder(layer_idx, outs, lses, seq_lens, merged)
    merged = merged[:, :Hq].reshape(B, Tq, Hq, D).permute(0, 2, 1, 3)
    return merged.to(query.dtype)
