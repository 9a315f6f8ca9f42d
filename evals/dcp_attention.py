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

Combine paths (``DCPSettings.combine``; evals/combine.py, batched over the ranks):
  ``triton``     dcp_a2a's kernels -- the default on CUDA. packed: every rank's rows in one
                 ``pack_send``, the all-to-all a transpose, one ``unpack_combine``; the other
                 backends: ``dcp_a2a.inprocess.lse_reduce_in_process`` (N ranks' generators);
  ``reference``  the pure-PyTorch reference of each backend's wire path -- the default on CPU
                 where the Triton interpreter is slow:
                   packed,         dcp_a2a.reference.contract's pack_send -> all-to-all ->
                   two_collective  unpack_combine: the float64 merge rounded once (both
                                   backends merge the same states)
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

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from dcp_a2a import BACKENDS  # noqa: F401  (the backends a DCPSettings may name)

from .combine import combine_distributed, combine_partials
from .kv_cache import DCPShardedCache  # noqa: F401  (its home was here)

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


def _rank_index(owner: torch.Tensor, ranks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slot[Tk], ids[len(ranks)])``: the position of each key's rank in ``ranks`` (or
    ``len(ranks)``, a slot that is dropped, for a rank not asked for) and ``ranks`` as a
    tensor -- built on the device (a contiguous range is an ``arange``: a host list copied to a
    CUDA device would be a synchronising copy at every layer)."""
    dev = owner.device
    first = ranks[0] if ranks else 0
    if ranks == list(range(first, first + len(ranks))):
        ids = torch.arange(first, first + len(ranks), device=dev)
    else:
        ids = torch.tensor(ranks, device=dev)
    hit = owner[:, None] == ids[None, :]  # [Tk, Rn]
    slot = torch.where(hit.any(dim=1), hit.to(torch.uint8).argmax(dim=1),
                       torch.full_like(owner, len(ranks)))
    return slot, ids


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

    The ranks share one score matrix ``s = q k^T`` (float32 at least). Each rank's max is one
    scatter-amax of ``s`` over the key axis and ``exp(s - max of the key's rank)`` is taken
    once per score; the probabilities of rank r are that with 0 outside its keys, and one
    ``p v`` product, whose rows are (head, rank, query), sums each rank over exactly its keys
    (the zeros add nothing): no gathered copy of a shard, the KV cache read once per call.
    (The sums keep the full key axis with zeros in place: summed over a compacted shard they
    would round in another order.)
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
    Rn = len(ranks)
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
    ex = torch.exp if base_e else torch.exp2
    log = torch.log if base_e else torch.log2
    slot, ids = _rank_index(owner, ranks)
    sv = torch.where(vis, s, -math.inf)  # [B, Hkv, G, 1, Tq, Tk]
    # each rank's max over its visible keys (slot Rn: keys of ranks not asked for)
    m_all = sv.new_full((*sv.shape[:-1], Rn + 1), -math.inf).scatter_reduce_(
        -1, slot.expand(sv.shape), sv, "amax")  # [B, Hkv, G, 1, Tq, Rn + 1]
    empty_all = m_all == -math.inf
    m_all = torch.where(empty_all, torch.zeros_like(m_all), m_all)  # m_safe
    p_all = ex(sv - m_all.gather(-1, slot.expand(sv.shape)))  # exactly 0 where not visible
    m_all = m_all[..., :Rn].transpose(3, -1)  # [B, Hkv, G, Rn, Tq, 1]
    empty_all = empty_all[..., :Rn].transpose(3, -1)
    vis_any = visible.any(dim=1)  # [B, Tq, Tk]
    nk = vis_any.new_zeros((B, Tq, Rn + 1), dtype=torch.long).scatter_add_(
        -1, slot.expand(vis_any.shape), vis_any.long())[..., :Rn].movedim(-1, 0)  # [Rn, B, Tq]
    per_rank = max(1, B * Hq * Tq * Tk)
    step = max(1, _SCORE_BUDGET // per_rank)
    outs, lses = [], []
    for c in range(0, Rn, step):
        Rc = min(step, Rn - c)
        mine = slot[None, :] == torch.arange(c, c + Rc, device=slot.device)[:, None]  # [Rc, Tk]
        p = torch.where(mine[:, None, :], p_all, 0.0)  # [B, Hkv, G, Rc, Tq, Tk]
        m_safe, empty = m_all[:, :, :, c:c + Rc], empty_all[:, :, :, c:c + Rc]
        total = p.sum(dim=-1, keepdim=True)
        denom = torch.where(empty, torch.ones_like(total), total)
        o = torch.matmul(p.reshape(B, Hkv, G * Rc * Tq, Tk), v).reshape(B, Hkv, G, Rc, Tq, D)
        o = torch.where(empty, torch.zeros_like(o), o / denom)
        lse = torch.where(empty, torch.full_like(m_safe, -math.inf), m_safe + log(denom))
        outs.append(o.permute(3, 0, 1, 2, 4, 5).reshape(Rc, B, Hq, Tq, D).to(out_dtype))
        lses.append(lse.squeeze(-1).permute(3, 0, 1, 2, 4).reshape(Rc, B, Hq, Tq)
                    .to(torch.float32))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    lse = lses[0] if len(lses) == 1 else torch.cat(lses)
    if single:
        return out[0], lse[0], nk[0]
    return out, lse, nk


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
    seq_lens = nk_all.reshape(-1, R).to(torch.int32)  # [Rn, R]
    sent_o, sent_s = o_all, s_all
    if settings.poison_empty:
        gone = seq_lens <= 0
        sent_o = o_all.masked_fill(gone[..., None, None], math.nan)
        sent_s = s_all.masked_fill(gone[..., None], 0.0)
    if settings.group is not None:
        merged = combine_distributed(sent_o[0], sent_s[0], seq_lens[0], settings)
    else:
        merged = combine_partials(sent_o, sent_s, seq_lens, settings)
    if settings.recorder is not None:
        settings.recorder(layer_idx, list(o_all.unbind(0)), list(s_all.unbind(0)),
                          list(seq_lens.unbind(0)), merged)
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
