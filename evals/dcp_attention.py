"""DCP attention as a transformers attention implementation (``attn_implementation="dcp"``).

Registered through transformers' own extension points (``AttentionInterface`` for the attention
function, ``AttentionMaskInterface`` for its mask, which is SDPA's boolean mask), so any model
that dispatches attention through ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2, Mistral, ...) runs
DCP-style without a patched model file::

    model = AutoModelForCausalLM.from_pretrained(...)
    attach_dcp(model, DCPSettings(world_size=3, backend="packed", lse_base="e"))

What one attention call does (query ``[B, Hq, Tq, D]``, key/value ``[B, Hkv, Tk, D]``):

1. Shard the KV sequence over N ranks as a DCP KV cache does: position j lives on rank
   ``(j // I) % N`` (I = ``interleave``; 1 = token interleave, the default; larger I = blocks
   of I tokens).
2. Each rank computes its partial attention over its shard with the causal and padding masks
   (softmax statistics in at least float32, GQA by grouping query heads per KV head): the
   normalised partial output ``o_r`` (in the wire dtype) and its log-sum-exp ``s_r`` (float32,
   base e or base 2 computed natively with exp2/log2 as FlashInfer MLA does). A row with no
   visible local key is an *empty shard*: ``o_r = 0``, ``s_r = -inf``, and its local KV length
   0 is passed to the combine as ``seq_lens`` so the combine masks it as well.
3. Rows are the B*Tq (request, query) pairs; heads are padded with empty heads (o = 0,
   s = -inf on every rank) up to a multiple of N, the partials are merged through the chosen
   backend, and the padding heads are dropped.

Combine paths (``DCPSettings.combine``):
  ``triton``     dcp_a2a's kernels: ``dcp_a2a.inprocess.lse_reduce_in_process`` (N ranks in
                 this process) -- the default on CUDA;
  ``reference``  the pure-PyTorch reference of each backend's wire path -- the default on CPU
                 where the Triton interpreter is slow:
                   packed,         dcp_a2a.reference.contract's pack_send -> all-to-all
                   two_collective  (dcp_a2a.testing.exchange) -> unpack_combine: the float64
                                   merge rounded once (both backends merge the same states)
                   ag_rs           all-gather the LSEs, weight each partial by exp(s_r - g) in
                                   fp32, round to the output dtype, reduce-scatter summing in
                                   the output dtype (rank order)
  Under torchrun (``DCPSettings.group`` set) each process is one rank: its KV cache
  (:class:`DCPShardedCache`) stores only the positions it owns, it computes the partial over
  them and calls ``dcp_a2a.lse_reduce`` on the real group, then all-gathers the head slices
  (every rank needs every head for the next layer, as in an engine's DCP decode).

``shard="decode"`` (default) runs only single-token query steps through DCP and the prefill
through transformers' SDPA, as engines do; ``shard="all"`` shards every call (teacher forcing).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from dcp_a2a import BACKENDS  # noqa: F401  (the backends a DCPSettings may name)

ATTN_NAME = "dcp"
COMBINES = ("auto", "triton", "reference")
_LOG2E = 1.4426950408889634


@dataclass
class DCPSettings:
    """How the attention of a model is sharded and combined (see the module docstring)."""

    world_size: int = 3
    backend: str = "packed"
    lse_base: str = "e"  # "e" or "2"
    combine: str = "auto"
    shard: str = "decode"  # "decode" or "all"
    interleave: int = 1
    # dtype of the partial outputs on the wire (default: the query dtype). The CI test runs a
    # float64 model and exchanges float32/bfloat16 partials so that the combine is the only
    # source of rounding it has to bound.
    wire_dtype: torch.dtype | None = None
    group: Any = None  # a dcp_a2a.Group over a real process group (torchrun)
    # with ``group``: the DCPShardedCache of the generate call in progress (where each layer's
    # local keys sit in the global sequence); set by whoever starts the generation
    kv_cache: Any = field(default=None, repr=False)
    # Write NaN outputs and a finite garbage LSE into the partials of rows with no local key
    # before the combine: proves the combine's seq_lens masking (tests only).
    poison_empty: bool = False
    # called as recorder(layer_idx, outs, lses, seq_lens, merged) with the clean per-rank
    # partials [R, Hp, D] / [R, Hp], local KV lengths [R] and the merged [R, Hp, D]
    recorder: Callable | None = field(default=None, repr=False)
    # with ``group`` and backend "symm_mem": the SymmMemBuffers per (heads, head dim, dtype),
    # made on first use by every rank at the same layer call and remade larger when a batch
    # has more rows (eager generation only: no CUDA graphs here)
    symm_buffers: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.group is not None:
            self.world_size = int(self.group.world_size)
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {self.world_size!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}: expected one of "
                             f"{', '.join(BACKENDS)}")
        if str(self.lse_base) not in ("e", "2"):
            raise ValueError(f"lse_base must be 'e' or '2', got {self.lse_base!r}")
        self.lse_base = str(self.lse_base)
        if self.combine not in COMBINES:
            raise ValueError(f"unknown combine {self.combine!r}: expected one of "
                             f"{', '.join(COMBINES)}")
        if self.shard not in ("decode", "all"):
            raise ValueError(f"shard must be 'decode' or 'all', got {self.shard!r}")
        if self.group is not None and self.shard != "decode":
            # a rank's cache holds only its own positions; an unsharded prefill is what fills it
            raise ValueError("over a process group only decode steps are sharded "
                             "(shard='decode')")
        if not isinstance(self.interleave, int) or self.interleave < 1:
            raise ValueError(f"interleave must be a positive int, got {self.interleave!r}")
        if self.wire_dtype not in (None, torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"wire_dtype must be float16, bfloat16 or float32, got "
                             f"{self.wire_dtype}")

    @property
    def base_e(self) -> bool:
        return self.lse_base == "e"

    def combine_for(self, device: torch.device) -> str:
        if self.combine != "auto":
            return self.combine
        return "triton" if device.type == "cuda" else "reference"


# ----------------------------------------------------------------------------- sharding
def shard_owner(kv_len: int, world_size: int, interleave: int = 1, device=None) -> torch.Tensor:
    """``owner[Tk]`` (int64): the rank holding KV position j, ``(j // interleave) % world_size``."""
    return (torch.arange(kv_len, device=device) // interleave) % world_size


def visible_mask(attention_mask, batch: int, q_len: int, kv_len: int,
                 device) -> torch.Tensor:
    """Boolean ``[B, 1 or Hq, Tq, Tk]`` (True = query may attend to key).

    ``None`` means plain causal attention with the queries being the last Tq positions (what
    SDPA's mask function returns when it can skip the mask)."""
    if attention_mask is None:
        qpos = torch.arange(kv_len - q_len, kv_len, device=device)
        kpos = torch.arange(kv_len, device=device)
        return (kpos[None, :] <= qpos[:, None]).expand(batch, 1, q_len, kv_len)
    if attention_mask.dtype == torch.bool:
        m = attention_mask
    else:
        neg = attention_mask < torch.finfo(attention_mask.dtype).min / 2
        if not bool(((attention_mask == 0) | neg).all()):
            raise ValueError("dcp attention accepts boolean or 0/-inf additive masks only "
                             "(an attention bias such as ALiBi is not supported)")
        m = ~neg
    if m.dim() != 4 or m.shape[-1] != kv_len or m.shape[-2] != q_len:
        raise ValueError(f"attention mask of shape {tuple(m.shape)} does not match "
                         f"[B, H, {q_len}, {kv_len}]")
    return m[..., :kv_len]


# ----------------------------------------------------------------------------- partials
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


# ----------------------------------------------------------------------------- combines
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


def _symm_buffers(settings: DCPSettings, out):
    from dcp_a2a import SymmMemBuffers

    R, H, D = out.shape
    key = (H, D, out.dtype)
    bufs = settings.symm_buffers.get(key)
    if bufs is None or bufs.tables.max_tokens < R:  # every rank has the same R: collective
        bufs = SymmMemBuffers(settings.group, max_tokens=max(R, 1), num_heads=H, head_dim=D,
                              dtype=out.dtype, device=out.device)
        settings.symm_buffers[key] = bufs
    return bufs


def _combine_distributed(out, lse, seq_lens, qsl, settings: DCPSettings):
    import torch.distributed as dist

    from dcp_a2a import lse_reduce

    kw = {}
    if settings.backend == "symm_mem":
        kw["buffers"] = _symm_buffers(settings, out)
    mine = lse_reduce(out, lse, settings.group, return_lse=False,
                      is_lse_base_on_e=settings.base_e, seq_lens=seq_lens,
                      query_start_loc=qsl, backend=settings.backend, **kw)
    n = settings.world_size
    R, hpr, D = mine.shape
    # rank-major along dim 0 (gloo checks each rank's chunk against the input's shape)
    gathered = torch.empty((n * R, hpr, D), dtype=mine.dtype, device=mine.device)
    # torch >= 2.13 renames all_gather_into_tensor (and warns on the old name)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(gathered, mine.contiguous(), group=settings.group.device_group)
    return gathered.view(n, R, hpr, D).permute(1, 0, 2, 3).reshape(R, n * hpr, D)


# ----------------------------------------------------------------------------- KV cache shard
@functools.lru_cache(maxsize=None)
def _shard_layer_class():
    """The cache layer class of :func:`DCPShardedCache`, derived from transformers'
    ``DynamicLayer`` at first use (importing this module needs no transformers)."""
    from transformers.cache_utils import DynamicLayer

    class DCPShardLayer(DynamicLayer):
        """One layer's KV cache on one DCP rank: only the positions j with
        ``(j // interleave) % world_size == rank`` are stored.

        ``update`` with several tokens is the (unsharded) prefill of an empty cache: it stores
        the owned positions and returns all the keys, so SDPA prefills as the unsharded model
        does. With one token (a decode step) it appends the token if owned and returns the
        local keys only. ``positions``: their global positions; ``total``: the global length
        (what ``get_seq_length`` reports, so transformers' positions and masks stay global)."""

        def __init__(self, rank: int, world_size: int, interleave: int):
            super().__init__()
            self.rank, self.world_size, self.interleave = rank, world_size, interleave
            self.total = 0
            self.positions = None

        def lazy_initialization(self, key_states, value_states):
            self.device = key_states.device
            self.keys = key_states[..., :0, :]
            self.values = value_states[..., :0, :]
            self.positions = torch.zeros(0, dtype=torch.long, device=self.device)
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            t = key_states.shape[-2]
            if t > 1 and self.total:
                raise NotImplementedError("the sharded DCP cache takes one prefill of an "
                                          "empty cache, then one token a step")
            pos = torch.arange(self.total, self.total + t, device=self.device)
            mine = (pos // self.interleave) % self.world_size == self.rank
            self.keys = torch.cat([self.keys, key_states[..., mine, :]], dim=-2)
            self.values = torch.cat([self.values, value_states[..., mine, :]], dim=-2)
            self.positions = torch.cat([self.positions, pos[mine]])
            self.total += t
            if t > 1:
                return key_states, value_states
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.total

        def reset(self) -> None:
            super().reset()
            self.total = 0
            self.positions = None

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("the sharded DCP cache cannot be cropped")

    return DCPShardLayer


def DCPShardedCache(num_layers: int, rank: int, world_size: int, interleave: int = 1):
    """A transformers ``Cache`` holding DCP rank ``rank``'s shard of the KV cache, one
    ``DCPShardLayer`` per layer (see :func:`_shard_layer_class`): the positions j with
    ``(j // interleave) % world_size == rank``, as a DCP engine's KV cache. Pass it to
    ``generate(past_key_values=...)`` and set it as ``DCPSettings.kv_cache``."""
    from transformers.cache_utils import Cache

    cls = _shard_layer_class()
    return Cache(layers=[cls(rank, world_size, interleave) for _ in range(num_layers)])


# ----------------------------------------------------------------------------- attention
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
    if settings.group is not None:
        merged = _combine_distributed(sent_outs[0], sent_lses[0], seq_lens[0], qsl, settings)
    else:
        merged = combine_partials(sent_outs, sent_lses, seq_lens, qsl, settings)
    if settings.recorder is not None:
        settings.recorder(layer_idx, outs, lses, seq_lens, merged)
    merged = merged[:, :Hq].reshape(B, Tq, Hq, D).permute(0, 2, 1, 3)
    return merged.to(query.dtype)


def dcp_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                          scaling: float | None = None, is_causal: bool | None = None,
                          **kwargs):
    """transformers attention-interface entry point; returns ([B, Tq, Hq, D], None)."""
    settings = getattr(module, "_dcp_settings", None)
    if settings is None:
        raise ValueError("attn_implementation='dcp' needs settings: call "
                         "evals.dcp_attention.attach_dcp(model, DCPSettings(...))")
    B, Hq, Tq, D = query.shape
    if settings.shard == "decode" and Tq > 1:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, is_causal=is_causal,
                                      **kwargs)
    if dropout and module.training:
        raise ValueError("dcp attention does not implement attention dropout")
    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        raise ValueError("dcp attention does not implement softcap or sliding windows")
    scaling = scaling if scaling is not None else D ** -0.5
    layer_idx = getattr(module, "layer_idx", None)
    if settings.group is not None:  # one rank of a process group: key/value are its shard
        if settings.kv_cache is None or layer_idx is None:
            raise ValueError("DCP over a process group needs the rank's sharded KV cache: "
                             "generate(past_key_values=cache) with DCPSettings.kv_cache = cache "
                             "(a DCPShardedCache)")
        layer = settings.kv_cache.layers[layer_idx]
        if key.shape[2] != layer.positions.numel():
            raise ValueError(f"layer {layer_idx}: {key.shape[2]} keys but the rank's cache "
                             f"holds {layer.positions.numel()}")
        vis = visible_mask(attention_mask, B, Tq, layer.total, query.device)
        out = dcp_attention(query, key, value, vis[..., layer.positions], scaling, settings,
                            layer_idx=layer_idx, local_kv=True)
        return out.transpose(1, 2).contiguous(), None
    vis = visible_mask(attention_mask, B, Tq, key.shape[2], query.device)
    out = dcp_attention(query, key, value, vis, scaling, settings, layer_idx=layer_idx)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register ``"dcp"`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, dcp_attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


def attach_dcp(model, settings: DCPSettings):
    """Run ``model``'s attention DCP-style with ``settings`` (switches it to "dcp")."""
    register()
    for m in model.modules():
        m._dcp_settings = settings
    model.set_attn_implementation(ATTN_NAME)
    return model


def detach_dcp(model, attn_implementation: str = "sdpa"):
    model.set_attn_implementation(attn_implementation)
    for m in model.modules():
        if hasattr(m, "_dcp_settings"):
            del m._dcp_settings
    return model
