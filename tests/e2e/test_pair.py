"""``python -m dcp_a2a.evals.pair``: GSM8K runs made apart, paired question by question. Runs
are written here as the driver writes them (results.json + samples_<backend>.jsonl), with
known answers, so every count below is known without running a model."""

from __future__ import annotations

import json

import pytest

from dcp_a2a.evals import pair

pytestmark = pytest.mark.unit

FILTERS = ("strict-match", "flexible-extract")


def _write_run(d, backend, correct, gens, **config):
    """A driver output directory of one backend: ``correct[i]`` is question i's score (both
    filters; the answer is "right" or "wrong"), ``gens[i]`` its generation."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"model": "m", "pretrained": "/models/m", "gguf_file": None, "limit": len(correct),
           "max_gen_toks": 8, "dtype": "float32", "dcp_size": 4, "lse_base": "e",
           "shard": "decode", "combine": "auto", "interleave": 1, "wire_dtype": None,
           "distributed": False} | config
    em = {f: {"em": sum(correct) / len(correct), "stderr": 0.1} for f in FILTERS}
    (d / "results.json").write_text(json.dumps(
        {"config": cfg, "baseline": backend, "paired": {},
         "runs": [{"backend": backend, "wall_s": 1.0, "em": em}]}))
    with open(d / f"samples_{backend}.jsonl", "w") as fh:
        for i, (c, g) in enumerate(zip(correct, gens)):
            a = {"answer": "right" if c else "wrong", "correct": float(c)}
            fh.write(json.dumps({"doc_id": i, "target": "#### 1", "generation": g,
                                 **{f: a for f in FILTERS}}) + "\n")
    return d


def _chars(text, add_special_tokens=False):  # a tokenizer: one token a character
    return {"input_ids": list(text)}


def test_runs_made_apart_pair_like_one_run(tmp_path):
    base = _write_run(tmp_path / "ref32", "reference", [1, 1, 1, 0, 0, 1], list("abcdef"))
    # bf16: questions 0-2 go from right to wrong, none the other way; two generations differ
    other = _write_run(tmp_path / "ref16", "reference", [0, 0, 0, 0, 0, 1],
                       ["a", "b", "x", "d", "e", "y"], dtype="bfloat16")
    runs = pair.load_runs(str(base)) + pair.load_runs(str(other))
    report = pair.pair_runs(runs, _chars)
    labels = ["reference, dtype=float32", "reference, dtype=bfloat16"]
    assert report["baseline"] == labels[0] and [r["backend"] for r in report["runs"]] == labels
    assert report["sources"] == {labels[0]: str(base), labels[1]: str(other)}
    p = report["paired"][labels[1]]
    assert p["n"] == 6 and p["identical_generations"] == pytest.approx(4 / 6)
    for f in FILTERS:
        # answers agree where both are right or both wrong: questions 3, 4 and 5
        assert p[f]["answer_agreement"] == pytest.approx(3 / 6)
        assert (p[f]["flips_right_to_wrong"], p[f]["flips_wrong_to_right"]) == (3, 0)
        assert p[f]["mcnemar_exact_p"] == pytest.approx(0.25)  # 2 x (1/2)^3, two-sided
    md = pair.markdown(report)
    # [0.030, 0.564]: the Wilson 95 % interval of 1 right in 6, worked by hand
    assert f"- `{labels[1]}`: {other}" in md
    assert f"| {labels[1]} | 0.167 ± 0.100 | [0.030, 0.564] | 0.500 |" in md


def test_a_colon_picks_one_backend_and_repeats_are_told_apart(tmp_path):
    d = _write_run(tmp_path / "a", "packed", [1, 0], ["p", "q"])
    again = _write_run(tmp_path / "b", "packed", [1, 0], ["p", "q"])
    runs = pair.load_runs(f"{d}:packed") + pair.load_runs(str(again))
    report = pair.pair_runs(runs, _chars)
    assert report["baseline"] == "packed"
    assert [r["backend"] for r in report["runs"]] == ["packed", f"packed [{again}]"]
    assert report["paired"][f"packed [{again}]"]["identical_generations"] == 1.0
    with pytest.raises(pair.MissingInput, match="holds no run of backend reference"):
        pair.load_runs(f"{d}:reference")


def test_runs_that_cannot_be_paired_are_refused(tmp_path):
    base = pair.load_runs(str(_write_run(tmp_path / "a", "reference", [1, 0, 1], list("abc"))))
    fewer = pair.load_runs(str(_write_run(tmp_path / "b", "packed", [1, 0], list("ab"))))
    with pytest.raises(ValueError, match="limit 2 against 3"):
        pair.comparable(base + fewer)
    other_model = pair.load_runs(str(_write_run(tmp_path / "c", "packed", [1, 0, 1],
                                                list("abc"), model="n", pretrained="/n")))
    with pytest.raises(ValueError, match="model 'n' against 'm', pretrained '/n'"):
        pair.comparable(base + other_model)
    shifted = _write_run(tmp_path / "d", "packed", [1, 0, 1], list("abc"))
    lines = (shifted / "samples_packed.jsonl").read_text().splitlines()
    moved = [json.loads(x) | {"doc_id": i + 1} for i, x in enumerate(lines)]
    (shifted / "samples_packed.jsonl").write_text("".join(json.dumps(s) + "\n" for s in moved))
    with pytest.raises(ValueError, match="answered other questions"):
        pair.comparable(base + pair.load_runs(str(shifted)))
    with pytest.raises(ValueError, match="at least one run to pair"):
        pair.comparable(base)


def test_the_command_fails_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        pair.main([str(tmp_path / "nowhere"), str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"python -m dcp_a2a.evals.pair: error: {tmp_path / 'nowhere' / 'results.json'}"
                   " not found; fix: pass the --out directory of a python -m dcp_a2a.evals.gsm8k"
                   " run, or its results JSON file")
    d = _write_run(tmp_path / "a", "reference", [1], ["a"])
    with pytest.raises(SystemExit) as e:  # one run: nothing to pair it with
        pair.main([str(d)])
    assert e.value.code == 2 and "at least one run to pair" in capsys.readouterr().err


def _records_only(d, name="kept.json"):
    """The run as kept under docs/results: its results file alone, the per-question
    records in it (written here as the driver writes them), no samples file."""
    from dcp_a2a.evals.records import question_records

    report = json.loads((d / "results.json").read_text())
    for r in report["runs"]:
        f = d / f"samples_{r['backend']}.jsonl"
        r["questions"] = question_records([json.loads(x) for x in f.read_text().splitlines()])
    out = d.parent / f"{d.name}-{name}"
    out.write_text(json.dumps(report))
    return out


def test_pairing_from_the_kept_records_alone(tmp_path):
    """Answers, correctness and a hash of each generation are kept per question in the results
    file: every paired number but the token-prefix agreement comes out of it alone, equal to
    what the samples give."""
    base = _write_run(tmp_path / "ref32", "reference", [1, 1, 1, 0, 0, 1], list("abcdef"))
    other = _write_run(tmp_path / "ref16", "reference", [0, 0, 0, 0, 0, 1],
                       ["a", "b", "x", "d", "e", "y"], dtype="bfloat16")
    full = pair.pair_runs(pair.load_runs(str(base)) + pair.load_runs(str(other)), _chars)
    kept = [_records_only(base), _records_only(other)]
    runs = pair.load_runs(str(kept[0])) + pair.load_runs(f"{kept[1]}:reference")
    assert all("generation" not in s for r in runs for s in r["samples"])
    apart = pair.pair_runs(runs, None)  # no tokenizer needed
    label = "reference, dtype=bfloat16"
    got, want = apart["paired"][label], full["paired"][label]
    assert got["token_prefix_agreement"] is None and want["token_prefix_agreement"] < 1
    assert {k: v for k, v in got.items() if k != "token_prefix_agreement"} == \
        {k: v for k, v in want.items() if k != "token_prefix_agreement"}
    assert got["identical_generations"] == pytest.approx(4 / 6)  # from the hashes
    assert f"| {label} | 0.167 ± 0.100 | [0.030, 0.564] | 0.500 | 3 | 0 | 0.25 | 0.667 | n/a |" \
        in pair.markdown(apart)
    # the paired report keeps every run's records and settings: it pairs again
    report = tmp_path / "paired.json"
    report.write_text(json.dumps(apart))
    again = pair.pair_runs(pair.load_runs(str(report)), None)
    assert again["paired"][label] == got


def test_the_command_pairs_records_without_the_model(tmp_path, monkeypatch, capsys):
    """No samples, so no tokenizer: the command never looks for the model (not prepared
    here), and says n/a for the token prefix."""
    from dcp_a2a.evals import model

    def no_model(*a, **k):
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr(model, "load_tokenizer", no_model)
    a = _records_only(_write_run(tmp_path / "a", "reference", [1, 0], ["p", "q"]))
    b = _records_only(_write_run(tmp_path / "b", "packed", [1, 1], ["p", "r"]))
    report = pair.main([str(a), str(b), "--out", str(tmp_path / "out")])
    assert report["paired"]["packed"]["identical_generations"] == 0.5
    assert report["paired"]["packed"]["strict-match"]["flips_wrong_to_right"] == 1
    out = capsys.readouterr().out
    # [0.342, 1.000]: Wilson's 95 % interval of 2 right in 2
    assert "| packed | 1.000 ± 0.100 | [0.342, 1.000] | 0.500 | 0 | 1 | 1 | 0.500 | n/a |" in out


def test_a_results_file_without_records_is_refused_in_one_line(tmp_path, capsys):
    old = _write_run(tmp_path / "old", "reference", [1], ["a"])
    copy = tmp_path / "old.json"
    copy.write_text((old / "results.json").read_text())
    with pytest.raises(SystemExit) as e:
        pair.main([str(copy), str(old)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "keeps no per-question records of reference" in err
