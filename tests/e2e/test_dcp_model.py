"""DCP attention inside a transformers model (tiny random Llama built here; no download).

Setup: the model runs in float64 and its attention partials go over the wire in T = float32 or
bfloat16 (``DCPSettings.wire_dtype``), so rounding the partials and the combine are the only
errors; the exact reference is the same model with exact float64 attention.

Per layer (derived bound, per element): the merged attention output is within
dcp_a2a's output bound of the float64 oracle merge of the partials each rank sent (through
``merge_check``) -- that is the combine's contract inside a real model, with padding, GQA,
empty shards (early positions, left padding) and padded heads (6 heads over N = 4).

Logits (derived bound, first order): with delta_l the per-element bound on the error of layer
l's attention output against exact attention,
    delta_l = output_bound_T(...) + (u_T + 2 u_32 max_n |s_n|) * sum_n w_n |o_n|
(the combine bound, plus rounding each partial o_n to T -- relative u_T -- and its LSE to fp32,
which moves each normalised weight by at most 2 u_32 max|s| relative), the logit error is
    |z - z*| <= slack * sum_l |J_l| delta_l + floor
where J_l = d logits / d (attention output of layer l) at the exact trajectory (computed here
with autograd in float64) and |J_l| its entrywise absolute value. ``slack`` covers the
second-order term (relative size ~ delta, <= 2^-8 for bfloat16) and ``floor`` float64 roundoff
of the rest of the network; both live in tolerances.yaml under ``e2e``.
"""

from __future__ import annotations

import math

import pytest
import torch

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)

pytestmark = pytest.mark.e2e

transformers = pytest.importorskip("transformers", reason="transformers is not installed (the test extra has it)")

from dcp_a2a.testing import tolerances as tol  # noqa: E402
from dcp_a2a.evals.dcp_attention import (  # noqa: E402
    DCPSettings, attach_dcp, partial_attention, register, shard_owner, visible_mask)
from dcp_a2a.testing.compare import oracle_bounds  # noqa: E402

N = 4
U32 = 2.0 ** -24
UNIT = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}
_EXACT = "e2e_exact"


def _exact_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     is_causal=None, **kwargs):
    """Exact float64 attention (one shard holding every key) + a perturbation eps[layer]."""
    B, H, Tq, D = query.shape
    vis = visible_mask(attention_mask, B, Tq, key.shape[2], query.device)
    out, _, _ = partial_attention(query, key, value, vis, scaling, True, query.dtype)
    out = out.transpose(1, 2)
    eps = getattr(module, "_e2e_eps", None)
    if eps is not None:
        out = out + eps[module.layer_idx]
    return out.contiguous(), None


@pytest.fixture(scope="module")
def tiny():
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    register()
    AttentionInterface.register(_EXACT, _exact_attention)
    AttentionMaskInterface.register(_EXACT, sdpa_mask)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation=_EXACT)
    model = LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():  # random init is tiny; widen the logits so softmaxes are not flat
        for p in model.parameters():
            p.mul_(3.0)
    ids = torch.randint(0, 32, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: rows with no visible key on some (or every) rank
    return model, ids, mask


def _exact_logits(model, ids, mask, eps=None):
    model.set_attn_implementation(_EXACT)
    for m in model.modules():
        m._e2e_eps = eps
    return model(input_ids=ids, attention_mask=mask).logits


@pytest.fixture(scope="module")
def jacobians(tiny):
    """|J_l|: [L, B*T*V, B*T*H*D] entrywise absolute Jacobians of the logits."""
    model, ids, mask = tiny
    cfg = model.config
    B, T = ids.shape
    H, D = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    eps0 = torch.zeros(cfg.num_hidden_layers, B, T, H, D, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(
        lambda e: _exact_logits(model, ids, mask, e).reshape(-1), eps0, vectorize=True)
    return jac.reshape(B * T * cfg.vocab_size, cfg.num_hidden_layers, -1).transpose(0, 1).abs()


CONFIGS = [(b, base, torch.float32) for b in ("packed", "two_collective", "ag_rs")
           for base in ("e", "2")] + [(b, "2", torch.bfloat16) for b in
                                      ("packed", "two_collective", "ag_rs")]
# (bfloat16 partials: per-layer bound only, see test_logits_within_derived_bound)


def _error_and_bound(tiny, jacobians, settings, merge_check=None):
    """(|z - z*|, derived bound) over the valid positions for one DCP configuration."""
    model, ids, mask = tiny
    e2e = tol.load()["e2e"]
    with torch.no_grad():
        exact = _exact_logits(model, ids, mask)
    layers = {}

    def record(layer, outs, lses, seq_lens, merged):
        layers[layer] = ([o.clone() for o in outs], [s.clone() for s in lses], merged.clone())

    settings.recorder = record
    attach_dcp(model, settings)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
    assert torch.isfinite(got).all(), "non-finite logits: an empty shard leaked its NaN partial"
    assert sorted(layers) == list(range(model.config.num_hidden_layers))
    base_e, wire = settings.base_e, settings.wire_dtype
    kind = "ag_rs" if settings.backend == "ag_rs" else "a2a"
    H = model.config.num_attention_heads
    B, T = ids.shape
    deltas = []
    for layer in sorted(layers):
        outs, lses, merged = layers[layer]
        outputs, lse_all = torch.stack(outs), torch.stack(lses)
        if merge_check is not None:  # the combine inside the model vs the float64 oracle
            merge_check(merged, None, outputs, lse_all, is_lse_base_on_e=base_e, kind=kind)
        orc = oracle_bounds(outputs, lse_all, wire, kind=kind, is_lse_base_on_e=base_e)
        s_max = torch.where(torch.isfinite(lse_all), lse_all.double().abs(),
                            torch.zeros_like(lse_all, dtype=torch.float64)).amax(0)
        delta = orc.out_bound + (UNIT[wire] + 2 * U32 * s_max[..., None]) * orc.mag
        deltas.append(delta[:, :H].reshape(-1))
    bound = torch.stack([jacobians[i] @ deltas[i] for i in range(len(deltas))]).sum(0)
    bound = e2e["first_order_slack"] * bound.reshape(got.shape) + e2e["float64_floor"]
    valid = mask.bool()
    return (got - exact).abs()[valid], bound[valid], exact[valid].abs().max().item()


@pytest.mark.parametrize("backend,base,wire", CONFIGS,
                         ids=[f"{b}-base{s}-{str(w)[6:]}" for b, s, w in CONFIGS])
def test_logits_within_derived_bound(tiny, jacobians, merge_check, backend, base, wire):
    settings = DCPSettings(world_size=N, backend=backend, lse_base=base, combine="reference",
                           shard="all", wire_dtype=wire, poison_empty=True)
    err, bound, scale = _error_and_bound(tiny, jacobians, settings, merge_check)
    if wire == torch.bfloat16:
        # bf16 partials: the first-order logit bound (u_T = 2^-8 through |J|) is of the order
        # of the logits themselves on this model, so bf16 is held to the per-layer bound only
        return
    ratio = (err / bound).max().item()
    assert ratio <= 1.0, (f"{backend} base {base} wire {wire}: max |Δlogit| "
                          f"{err.max().item():.3g} is {ratio:.3g}x the derived bound")
    assert bound.max().item() < 1e-2 * scale, "the bound is vacuous"


def test_bound_catches_lse_rounded_to_bf16(tiny, jacobians):
    """Mutation: a combine that sees LSEs rounded to bfloat16 must break the logit bound."""
    import dcp_a2a.evals.combine as dc

    orig = dc._REFERENCE["packed"]

    def bad(outs, lses, *a):  # lses: [N, R, Hp], every rank's
        return orig(outs, lses.to(torch.bfloat16).to(torch.float32), *a)

    dc._REFERENCE["packed"] = bad
    try:
        settings = DCPSettings(world_size=N, backend="packed", lse_base="e",
                               combine="reference", shard="all", wire_dtype=torch.float32)
        err, bound, _ = _error_and_bound(tiny, jacobians, settings)
    finally:
        dc._REFERENCE["packed"] = orig
    assert (err / bound).max().item() > 1.0


@pytest.mark.parametrize("interleave", [1, 3])
def test_shard_owner_partition(interleave):
    owner = shard_owner(10, 4, interleave)
    assert owner.shape == (10,) and owner.dtype == torch.int64
    for j in range(10):
        assert int(owner[j]) == (j // interleave) % 4


def test_empty_rows_are_identity_not_nan():
    q = torch.randn(1, 2, 3, 4)
    k = torch.randn(1, 1, 2, 4)
    vis = torch.tensor([[[[False, False], [True, False], [True, True]]]])
    out, lse, nk = partial_attention(q, k, k, vis, 0.5, True, torch.float32)
    assert torch.equal(nk, torch.tensor([[0, 1, 2]]))
    assert (lse[:, :, 0] == -math.inf).all() and (out[:, :, 0] == 0).all()
    assert torch.isfinite(lse[:, :, 1:]).all() and torch.isfinite(out).all()


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="backend"):
        DCPSettings(backend="nccl")
    with pytest.raises(ValueError, match="lse_base"):
        DCPSettings(lse_base="10")
    with pytest.raises(ValueError, match="world_size"):
        DCPSettings(world_size=0)
