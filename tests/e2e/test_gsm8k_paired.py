"""The GSM8K driver's paired statistics on hand-made samples (no model, no lm-eval run)."""

from __future__ import annotations

import pytest

from dcp_a2a.evals.gsm8k import FILTERS, paired

pytestmark = pytest.mark.e2e


def _tok(text, add_special_tokens=False):
    return {"input_ids": list(text)}


def _run(gens_and_correct):
    return {"samples": [{"doc_id": i, "generation": g,
                         **{f: {"answer": str(c), "correct": float(c)} for f in FILTERS}}
                        for i, (g, c) in enumerate(gens_and_correct)]}


def test_identical_runs_agree_fully_even_with_empty_generations():
    base = _run([("abc", 1), ("", 0), ("xy", 0)])
    out = paired(base, _run([("abc", 1), ("", 0), ("xy", 0)]), _tok)
    assert out["identical_generations"] == 1.0 and out["token_prefix_agreement"] == 1.0
    for f in FILTERS:
        assert out[f]["answer_agreement"] == 1.0 and out[f]["mcnemar_exact_p"] == 1.0


def test_flips_and_prefixes():
    base = _run([("abcd", 1), ("ab", 0), ("zz", 1)])
    other = _run([("abXX", 0), ("ab", 1), ("zz", 1)])
    out = paired(base, other, _tok)
    assert out["identical_generations"] == pytest.approx(2 / 3)
    assert out["token_prefix_agreement"] == pytest.approx((0.5 + 1 + 1) / 3)
    f = FILTERS[0]
    assert out[f]["flips_right_to_wrong"] == 1 and out[f]["flips_wrong_to_right"] == 1


def test_markdown_of_a_single_question_run():
    """lm-eval reports the stderr of one question as the string "N/A": the table says nan."""
    from dcp_a2a.evals.gsm8k import _number, markdown

    assert _number("N/A") != _number("N/A") and _number("0.25") == 0.25
    run = {"backend": "reference", "wall_s": 1.0,
           "em": {f: {"em": 1.0, "stderr": _number("N/A")} for f in FILTERS}}
    report = {"baseline": "reference", "runs": [run], "paired": {},
              "config": {"limit": 1, "max_gen_toks": 8, "dcp_size": 3, "lse_base": "e",
                         "shard": "decode", "combine": "auto", "dtype": "float32"}}
    text = markdown(report)
    assert "| reference | 1.000 ± nan |" in text
