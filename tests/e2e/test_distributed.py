"""DCP over a real process group: ``torchrun --nproc-per-node 2 -m dcp_a2a.evals.gsm8k
--distributed`` on 2 gloo ranks with a tiny model (each rank holds its KV shard and merges
partials with dcp_a2a.lse_reduce -- its Triton kernels, interpreted on the CPU -- on the group
at every decode step; rank 0 runs lm-eval and broadcasts each generate call).

The distributed packed run must generate exactly the tokens of the single-process simulation of
the same 2 ranks. The model runs in float64 with float32 partials on the wire, so the partials
of the two runs (same keys, summed in a different order) round to the same float32 values and
every greedy token must agree. A control run whose combine drops rank 1's partial must change
the generations: the comparison can fail (so does the distributed run when a rank's shard is
masked with the wrong columns of the padding mask, checked by hand).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # torchrun, 2 ranks, lm-eval: ~40 s
transformers = pytest.importorskip("transformers",
                                   reason="transformers is not installed (the test extra has it)")
pytest.importorskip("lm_eval", reason="lm-eval is not installed (the test extra has it)")


@pytest.fixture(scope="module")
def sharp_model(tiny_dir, tmp_path_factory):
    """tiny_dir's tokenizer with a tiny Llama whose weights (norms aside) are scaled by 3: the
    random init is so flat that its greedy tokens barely depend on the prompt, and attention
    must matter for the comparison to mean anything. 512 positions, so lm-eval's 5-shot prompts
    (~300 tokens) are left-padded, not truncated to one length: the padding mask of each rank's
    shard is exercised."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("sharp_model")
    tok = AutoTokenizer.from_pretrained(tiny_dir[0])
    tok.save_pretrained(d)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(3.0)
    model.save_pretrained(d)
    return d


def _generations(out_dir, backend):
    lines = (out_dir / f"samples_{backend}.jsonl").read_text().splitlines()
    return [json.loads(x)["generation"] for x in lines]


def test_torchrun_packed_matches_in_process_simulation(tiny_dir, sharp_model, tmp_path,
                                                        monkeypatch):
    import torch

    import dcp_a2a.evals.combine as dc
    from dcp_a2a.evals import gsm8k

    model_dir, data = sharp_model, tiny_dir[1]
    common = ["--limit", "2", "--batch-size", "2", "--max-gen-toks", "6",
              "--pretrained", str(model_dir), "--gsm8k-dir", str(data),
              "--dtype", "float64", "--wire-dtype", "float32"]
    dist_out = tmp_path / "dist"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "dcp_a2a.evals.gsm8k", "--distributed", "--backends", "packed",
           *common, "--out", str(dist_out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    # rank 0 alone scores and writes: one result line, one set of files
    assert log.count("packed: strict-match") == 1, log[-4000:]
    assert sorted(p.name for p in dist_out.iterdir()) == [
        "results.json", "results.md", "samples_packed.jsonl"]
    report = json.loads((dist_out / "results.json").read_text())
    assert report["config"]["distributed"] == {"world_size": 2, "process_group": "gloo",
                                               "device_rank0": "cpu"}
    assert report["config"]["dcp_size"] == 2
    assert report["runs"][0]["rank_token_mismatches"] == 0

    # the same 2 ranks simulated in this process; "two_collective" is the control: its combine
    # keeps only rank 0's partial (rank 1's LSE set to -inf), a wrong merge
    good = dc._REFERENCE["two_collective"]

    def drop_rank1(outs, lses, *rest):  # lses: [N, R, Hp], every rank's
        return good(outs, torch.cat([lses[:1], torch.full_like(lses[1:], -math.inf)]), *rest)

    monkeypatch.setitem(dc._REFERENCE, "two_collective", drop_rank1)
    sim_out = tmp_path / "sim"
    gsm8k.main(["--backends", "packed,two_collective", "--dcp-size", "2", "--combine",
                "reference", "--device", "cpu", *common, "--out", str(sim_out)])
    distributed = _generations(dist_out, "packed")
    assert len(distributed) == 2 and all(distributed)
    assert distributed == _generations(sim_out, "packed")
    assert _generations(sim_out, "two_collective") != distributed, \
        "dropping a rank's partial did not change any token: the comparison has no power"
