"""The eval drivers end to end on the tiny model saved to disk by ``tiny_dir`` (conftest.py;
no hub, no real GSM8K): ``python -m dcp_a2a.evals.logit_parity`` loads it by path like any HF
model, runs every requested backend / base / dtype, writes JSON + markdown, and adds the 16-bit
floor row; ``python -m dcp_a2a.evals.gsm8k`` runs lm-eval's harness on it per backend."""

from __future__ import annotations

import json
import re

import pytest

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the test extra has it)")


def test_logit_parity_driver(tiny_dir, tmp_path):
    from dcp_a2a.evals import logit_parity

    model_dir, data = tiny_dir
    out = tmp_path / "lp"
    report = logit_parity.main([
        "--pretrained", str(model_dir), "--gsm8k-dir", str(data), "--limit", "3",
        "--batch-size", "2", "--dtypes", "float32,bfloat16", "--backends", "packed,ag_rs",
        "--bases", "e,2", "--dcp-size", "4", "--device", "cpu", "--out", str(out)])
    rows = report["rows"]
    assert report["texts"] == 3
    keys = {(r["dtype"], r["backend"], r["lse_base"]) for r in rows}
    assert keys == {(dt, b, s) for dt in ("float32", "bfloat16") for b in ("packed", "ag_rs")
                    for s in ("e", "2")} | {("bfloat16", "unsharded float32 -> bfloat16", "-")}
    positions = {r["positions"] for r in rows}
    assert len(positions) == 1 and positions.pop() > 0  # every row over the same positions
    for r in rows:
        assert r["nonfinite"] == 0, r
        if r["dtype"] == "float32":  # the combine's fp32 rounding cannot move the argmax here
            assert r["top1_agreement"] == 1.0, r
    saved = json.loads((out / "logit_parity.json").read_text())
    assert saved["rows"] == rows
    md = (out / "logit_parity.md").read_text()
    assert "| bfloat16 | unsharded float32 -> bfloat16 | - |" in md
    assert md.count("\n| float32 |") == 4


def test_gsm8k_driver_through_lm_eval(tiny_dir, tmp_path, monkeypatch, capfd):
    """``python -m evals.gsm8k``: lm-eval's harness with the registered ``dcp-hf`` model and the
    ``gsm8k_local`` YAML task (5-shot from the local train split), every backend on the same
    questions, paired statistics against ``reference``. Run outside a git checkout: lm-eval
    asks git for a commit hash, and git's ``fatal: not a git repository`` reached the driver's
    stderr."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (the test extra has it)")
    from dcp_a2a.evals import gsm8k

    model_dir, data = tiny_dir
    out = tmp_path / "g"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    report = gsm8k.main([
        "--backends", "reference,packed,ag_rs", "--limit", "3", "--batch-size", "2",
        "--max-gen-toks", "6", "--dcp-size", "4", "--pretrained", str(model_dir),
        "--gsm8k-dir", str(data), "--device", "cpu", "--out", str(out)])
    err = capfd.readouterr().err  # git's own stderr too: its file descriptor is captured
    assert "fatal:" not in err and "not a git repository" not in err, err[-2000:]
    assert [r["backend"] for r in report["runs"]] == ["reference", "packed", "ag_rs"]
    assert report["baseline"] == "reference" and set(report["paired"]) == {"packed", "ag_rs"}
    for name in ("packed", "ag_rs"):
        p = report["paired"][name]
        assert p["n"] == 3
        # float32 partials: the combine's rounding does not change a greedy token here
        assert p["identical_generations"] == 1.0 and p["token_prefix_agreement"] == 1.0, p
        for f in gsm8k.FILTERS:
            assert p[f]["answer_agreement"] == 1.0 and p[f]["mcnemar_exact_p"] == 1.0
    for r in report["runs"]:
        for f in gsm8k.FILTERS:
            assert 0.0 <= r["em"][f]["em"] <= 1.0
    samples = [json.loads(x) for x in (out / "samples_packed.jsonl").read_text().splitlines()]
    assert [s["doc_id"] for s in samples] == [0, 1, 2]
    for run in json.loads((out / "results.json").read_text())["runs"]:  # per-question records
        assert [q["doc_id"] for q in run["questions"]] == [0, 1, 2]
        assert all(re.fullmatch(r"[0-9a-f]{16}", q["generation_sha256"])
                   for q in run["questions"])
    assert {s["target"] for s in samples} == {"... #### 7", "... #### 8", "... #### 9"}
    assert json.loads((out / "results.json").read_text())["paired"] == report["paired"]
    assert "| packed |" in (out / "results.md").read_text()
    # the same pairs from the run's directory, one backend at a time (python -m
    # dcp_a2a.evals.pair): as the driver paired them
    from dcp_a2a.evals import pair

    apart = pair.main([f"{out}:reference", f"{out}:packed", f"{out}:ag_rs",
                       "--out", str(tmp_path / "p")])
    assert apart["paired"] == report["paired"] and apart["baseline"] == "reference"
    assert json.loads((tmp_path / "p" / "results.json").read_text())["paired"] == apart["paired"]
    # and from the results file alone (what docs/results keeps): its per-question records
    # give every number but the token-prefix agreement
    kept = tmp_path / "kept.json"
    kept.write_text((out / "results.json").read_text())
    runs = [r for b in ("reference", "packed", "ag_rs") for r in pair.load_runs(f"{kept}:{b}")]
    for name, p in pair.pair_runs(runs, None)["paired"].items():
        assert p.pop("token_prefix_agreement") is None
        assert p == {k: v for k, v in report["paired"][name].items()
                     if k != "token_prefix_agreement"}
