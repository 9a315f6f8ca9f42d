"""The speed-up of the simulated-DCP path keeps every bit: today's code (one scatter-amax and one
exp per score, the ranks' combines batched, the preallocated KV cache) against a frozen copy of
the path it replaced (legacy_dcp_attention.py: N masked score copies, per-rank lists and
combines, transformers' DynamicCache).

A tiny random Llama (6 query heads, 2 KV heads: N = 4 pads the heads; left padding: rows with
empty shards) generates greedily in float32 -- and once in bfloat16 -- for every backend, LSE
base and the unsharded reference, with the reference wire path and (base e) dcp_a2a's Triton
kernels; the logits of every step must be bitwise equal, so the tokens are. The comparison
has the power to see a rounding: the packed run's logits differ in bits from the unsharded
model's (another summation order) while its tokens do not. Sharding every
position (teacher forcing, the logit-parity path; interleave 2, N = 3) is held to the same.

On a CUDA machine the same tests run on the GPU too, where the combine is dcp_a2a's Triton
kernels (``combine=auto``); the batched packed and two_collective combines are also held to
the per-rank ``lse_reduce_in_process`` on random partials, on the CPU through Triton's
interpreter.
"""

from __future__ import annotations

import copy
import math
import sys

import pytest
import torch

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)
from dcp_a2a import _env

pytestmark = [pytest.mark.e2e,  # generate(past_key_values=) is what DCPHFLM passes too
              pytest.mark.filterwarnings("ignore:.*past_key_values.*deprecated:FutureWarning")]
transformers = pytest.importorskip("transformers",
                                   reason="transformers is not installed (the test extra has it)")

import dcp_a2a.evals.dcp_attention as da  # noqa: E402
from dcp_a2a.evals.combine import combine_partials  # noqa: E402
from dcp_a2a.evals.kv_cache import PreallocatedCache  # noqa: E402

from . import legacy_dcp_attention as legacy  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
GEN = 6  # new tokens per generation


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                      pad_token_id=0, eos_token_id=1, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random init is flat: sharpen it so attention moves the tokens
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(3.0)
    ids = torch.randint(2, 96, (3, 21))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0   # left padding: the first decode steps have rows with empty shards
    mask[2, :13] = 0
    ids[mask == 0] = 0
    return model, ids, mask


def _generate(model, ids, mask, backend, base, *, old: bool, dtype, device, monkeypatch,
              combine="auto"):
    """(tokens [B, GEN], logits [GEN, B, V]) of a greedy generation with today's path or the
    frozen one."""
    m = copy.deepcopy(model).to(device=device, dtype=dtype)  # the fixture's stays float32
    if backend == "reference":
        da.detach_dcp(m)
    else:
        da.attach_dcp(m, da.DCPSettings(world_size=4, backend=backend, lse_base=base,
                                        combine=combine))
    with monkeypatch.context() as mp:
        kw = {}
        if old:
            mp.setattr(da, "dcp_attention", legacy.dcp_attention)
        else:
            kw["past_key_values"] = PreallocatedCache(m.config, ids.shape[1] + GEN)
        with torch.no_grad():
            out = m.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             max_new_tokens=GEN, min_new_tokens=GEN, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, **kw)
    da.detach_dcp(m)
    return out.sequences[:, ids.shape[1]:].cpu(), torch.stack(out.logits).cpu()


# (backend, LSE base, dtype, combine): "auto" is the reference wire path on the CPU and the
# Triton kernels on CUDA; "triton" on the CPU runs the kernels through Triton's interpreter
# (the two combines batched on Triton; ag_rs's lse_reduce_in_process is the code it was, but
# fed other tensors: its seq_lens became views with strides, which the kernels once misread)
CASES = ([(b, s, torch.float32, "auto") for b in ("reference", "packed", "two_collective",
                                                  "ag_rs") for s in ("e", "2")]
         + [("packed", "e", torch.bfloat16, "auto")]
         + [(b, "e", torch.float32, "triton") for b in ("packed", "two_collective", "ag_rs")])


def _kernels_can_run(device, combine):
    """The Triton combine on CPU tensors needs the interpreter, which dcp_a2a enables only on
    a machine without CUDA (on a GPU machine the same comparisons run on the GPU)."""
    if device == "cpu" and combine == "triton" and not _env.INTERPRET:
        pytest.skip("Triton's interpreter is off (a CUDA machine): the kernels run on the "
                    "GPU in the cuda cases")


_EXP2 = torch.exp2


def _exp2_anywhere(x, *args, **kwargs):
    """torch.exp2 that gives an element the same bits wherever it sits in its tensor: ATen's
    CPU exp2 runs a vectorised (Sleef) exp2 over the body of its loop and the scalar std::exp2
    over the tail, and the two differ in the last bit for some inputs (about 1 in 15 here), so
    the same number can round differently in a tensor of another shape. Padding the flat tensor
    to a multiple of the vector loop's stride leaves no tail (these tensors are far below
    ATen's parallel grain: one chunk)."""
    flat = x.reshape(-1)
    pad = (-flat.numel()) % 64
    y = _EXP2(torch.cat([flat, flat.new_zeros(pad)]) if pad else flat, *args, **kwargs)
    return y[:flat.numel()].reshape(x.shape)


def _old_and_new(model, ids, mask, backend, base, **kw):
    return [_generate(model, ids, mask, backend, base, old=old, **kw) for old in (True, False)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend,base,dtype,combine", CASES,
                         ids=[f"{b}-base{s}-{str(d)[6:]}-{c}" for b, s, d, c in CASES])
def test_generations_keep_their_bits(tiny, backend, base, dtype, combine, device,
                                     monkeypatch):
    """The same tokens, and bitwise the same logits at every step. One exception, not of the
    speed-up's making: base 2 on the CPU, where the batched combines and the one-exp partials
    call exp2 on tensors of other shapes, so ATen's CPU exp2 (see _exp2_anywhere) may round an
    element differently -- as it may when the batch size changes. There the tokens must be the
    same and the logits equal to a few float32 ulps, and bitwise equal once exp2 is made
    position-independent (in both paths): every other operation keeps its bits. (CUDA's exp2,
    like Triton's, computes each element alike wherever it sits.)"""
    model, ids, mask = tiny
    if backend == "reference" and base == "2":
        pytest.skip("the unsharded model has no LSE base")
    _kernels_can_run(device, combine)
    kw = dict(dtype=dtype, device=device, monkeypatch=monkeypatch, combine=combine)
    (tok_old, log_old), (tok_new, log_new) = _old_and_new(model, ids, mask, backend, base, **kw)
    assert torch.equal(tok_new, tok_old)
    diff = (log_new.float() - log_old.float()).abs().max().item()
    if base == "2" and device == "cpu":
        assert diff <= 1e-6, diff
        monkeypatch.setattr(torch, "exp2", _exp2_anywhere)
        (tok_old, log_old), (tok_new, log_new) = _old_and_new(model, ids, mask, backend, base,
                                                              **kw)
        diff = (log_new.float() - log_old.float()).abs().max().item()
    assert torch.equal(log_new, log_old), f"logits moved by up to {diff:.3g}"


@pytest.mark.parametrize("device", DEVICES)
def test_the_bitwise_comparison_sees_a_rounding(tiny, device, monkeypatch):
    """packed against the unsharded model: the same tokens, logits that differ in their last
    bits -- what the equality above would report if the speed-up had moved a rounding."""
    model, ids, mask = tiny
    kw = dict(old=False, dtype=torch.float32, device=device, monkeypatch=monkeypatch)
    tok_ref, log_ref = _generate(model, ids, mask, "reference", "e", **kw)
    tok_dcp, log_dcp = _generate(model, ids, mask, "packed", "e", **kw)
    assert torch.equal(tok_dcp, tok_ref)
    diff = (log_dcp - log_ref).abs().max().item()
    assert 0 < diff < 1e-4, diff


# "triton" on the CPU is the kernels through the interpreter; on CUDA "auto" is the kernels
@pytest.mark.parametrize("device,combine",
                         [("cpu", "auto"), ("cpu", "triton")] + [("cuda", "auto")] * (
                             "cuda" in DEVICES), ids=lambda v: v)
@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs"])
def test_every_position_sharded_keeps_its_bits(tiny, backend, combine, device, monkeypatch):
    """shard='all' (logit parity): prefill through the combine, causal mask, N = 3,
    interleave 2 (base e: see test_generations_keep_their_bits for base 2 on the CPU). Every
    position's row is its own request here, and a rank's local KV lengths are a column of the
    [rows, N] table: ag_rs on the Triton kernels once read that column as if contiguous (the
    neighbouring ranks' lengths masked the rows; logits off by up to 28 on the 1.5B model)."""
    model, ids, mask = tiny
    _kernels_can_run(device, combine)
    m = copy.deepcopy(model).to(device=device)
    da.attach_dcp(m, da.DCPSettings(world_size=3, backend=backend, lse_base="e", shard="all",
                                    interleave=2, combine=combine))
    try:
        with torch.no_grad():
            new = m(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            monkeypatch.setattr(da, "dcp_attention", legacy.dcp_attention)
            old = m(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    finally:
        da.detach_dcp(m)
    assert torch.equal(new, old)


@pytest.mark.parametrize("backend", ["packed", "two_collective"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_kernels_equal_per_rank_lse_reduce(dtype, backend):
    """The Triton combine of all ranks' rows at once (packed: one pack_send, one
    unpack_combine; two_collective: one lse_to_wire, one combine_separate) against every
    rank's lse_reduce generator (lse_reduce_in_process): the same bits, with empty rows
    carrying NaN partials (masked by seq_lens)."""
    from dcp_a2a.inprocess import lse_reduce_in_process

    dev = DEVICES[-1]
    g = torch.Generator().manual_seed(1)
    n, r, hp, d = 4, 5, 8, 16
    outs = torch.randn(n, r, hp, d, generator=g).to(dtype)
    lses = torch.randn(n, r, hp, generator=g) * 4
    seq_lens = torch.randint(0, 3, (n, r), generator=g, dtype=torch.int32)
    seq_lens[:, 2] = 0  # a row no rank has a key for
    outs[seq_lens <= 0] = math.nan
    outs, lses, seq_lens = outs.to(dev), lses.to(dev), seq_lens.to(dev)
    settings = da.DCPSettings(world_size=n, backend=backend, combine="triton")
    got = combine_partials(outs, lses, seq_lens, settings)
    want = torch.cat(lse_reduce_in_process(
        list(outs.unbind(0)), list(lses.unbind(0)), return_lse=False, is_lse_base_on_e=True,
        seq_lens=list(seq_lens.unbind(0)),
        query_start_loc=torch.arange(r + 1, dtype=torch.int32, device=dev), backend=backend),
        dim=1)
    assert torch.isfinite(got).all()
    assert torch.equal(got, want)


def test_the_decode_step_benchmark_times_every_backend(tiny_dir, tmp_path):
    """benchmarks/benchmark_eval_decode_step.py on the tiny model: a row per backend, and the
    result files with the run's card and commit."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "benchmark_eval_decode_step.py"
    sys.path.insert(0, str(path.parent))  # the script imports its neighbour _run
    try:
        spec = importlib.util.spec_from_file_location("_decode_step_benchmark", path)
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        report = bench.main(["--pretrained", str(tiny_dir[0]), "--batch-size", "2",
                             "--context", "12", "--steps", "3", "--rounds", "1",
                             "--device", "cpu", "--out", str(tmp_path)])
    finally:
        sys.path.remove(str(path.parent))
    rows = report["rows"]
    assert [r["backend"] for r in rows] == list(bench.BACKENDS)
    assert all(r["steps"] == 2 and r["median_ms"] > 0 for r in rows)
    saved = json.loads((tmp_path / "decode_step.json").read_text())
    assert saved["rows"] == rows and saved["run"]["card"].startswith("CPU")
    assert "ms/step" in (tmp_path / "decode_step.md").read_text()
