"""benchmarks/benchmark_up_projection.py: its --smoke run on the CPU, the crossover it reads off
the rows, the switch points it writes and that lse_reduce(up_proj="auto") then uses, and its
refusal of arguments that mean nothing."""

from __future__ import annotations

import json
import pytest
import torch

from dcp_a2a import up_projection

pytestmark = pytest.mark.unit

@pytest.fixture(scope="module")
def bench():
    from tests.unit.test_documented_commands import load_script

    return load_script("benchmarks/benchmark_up_projection.py")


def test_smoke_run_writes_the_report(bench, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert bench.main([str(out), "--smoke"]) == 0
    report = json.loads(out.read_text())
    assert report["shape"] == {"heads": 4, "latent": 32, "value": 8, "dtype": "bfloat16"}
    assert report["run"]["commit"] and report["card"] == bench.card(torch.device(
        "cuda" if torch.cuda.is_available() else "cpu"))
    assert "project first from" in out.with_suffix(".md").read_text()
    assert [(r["N"], r["B"]) for r in report["rows"]] == [(2, 1), (2, 4)]
    for r in report["rows"]:
        # bf16: P = 2 lanes; (N - 1) slices of [B, H/N, lanes + P], 2 bytes each
        assert r["wire_bytes"] == {"before_exchange": 1 * r["B"] * 2 * (8 + 2) * 2,
                                   "after_merge": 1 * r["B"] * 2 * (32 + 2) * 2}
        assert r["before_exchange_us"] > 0 and r["after_merge_us"] > 0
        assert len(r["rounds_us"]["before_exchange"]) == 2
    assert set(report["crossover"]) == {"2"}
    assert "project first from" in capsys.readouterr().out


def _row(n, b, ratio, faster):
    return {"N": n, "B": b, "ratio": ratio, "before_exchange_faster": faster}


def test_crossover_is_where_projecting_first_wins_from_then_on(bench):
    rows = [_row(4, 1, 1.3, "no"), _row(4, 2, 0.9, "undecided"), _row(4, 4, 1.1, "no"),
            _row(4, 8, 0.8, "yes"), _row(4, 16, 0.7, "yes"),
            _row(8, 1, 1.2, "no"), _row(8, 2, 1.1, "no")]
    got = bench.crossovers(rows)
    assert got["4"] == {"min_tokens": 8, "every_interval_below_1": True}
    assert got["8"] == {"min_tokens": None, "every_interval_below_1": None}


def test_written_switch_points_are_the_ones_auto_uses(bench, tmp_path, monkeypatch):
    """--write's entry for a card and shape, read back by dcp_a2a.up_projection for that card
    (faked here: the CPU has no card) and for no other shape."""
    data = tmp_path / "switch.json"
    report = {"card": {"name": "Fake GPU", "capability": "9.0"},
              "run": {"commit": "abc", "date": "2026-12-07"},
              "shape": {"heads": 8, "latent": 64, "value": 16, "dtype": "bfloat16"},
              "crossover": {"4": {"min_tokens": 24}, "8": {"min_tokens": None}}}
    bench.write_switch(report, data)
    bench.write_switch(report, data)  # replaces its own entry
    assert len(json.loads(data.read_text())["cards"]) == 1
    monkeypatch.setattr(up_projection, "DATA_FILE", data)
    monkeypatch.setattr(up_projection, "_card", lambda device: ("Fake GPU", "9.0"))
    for f in (up_projection.measured, up_projection.switch_point):
        f.cache_clear()
    try:
        dev = torch.device("cpu")
        assert up_projection.switch_point(dev, 4, 8, 64, 16, torch.bfloat16) == 24
        assert up_projection.switch_point(dev, 8, 8, 64, 16, torch.bfloat16) is None
        # another group size, shape or dtype: the byte model
        for n, h, dtype in ((2, 8, torch.bfloat16), (4, 16, torch.bfloat16),
                            (4, 8, torch.float16)):
            assert up_projection.switch_point(dev, n, h, 64, 16, dtype) == \
                up_projection.byte_model_switch(h, 64, 16, n)
    finally:
        for f in (up_projection.measured, up_projection.switch_point):
            f.cache_clear()


def test_a_bad_data_file_is_named(tmp_path, monkeypatch):
    bad = tmp_path / "switch.json"
    bad.write_text('{"cards": [{"name": "Fake GPU", "shape": {"heads": 8, "latent": 64, '
                   '"value": 16, "dtype": "bfloat16"}, "min_tokens": {"4": -3}}]}')
    monkeypatch.setattr(up_projection, "DATA_FILE", bad)
    monkeypatch.setattr(up_projection, "_card", lambda device: ("Fake GPU", "9.0"))
    for f in (up_projection.measured, up_projection.switch_point):
        f.cache_clear()
    try:
        with pytest.raises(ValueError, match="min_tokens"):
            up_projection.switch_point(torch.device("cpu"), 4, 8, 64, 16, torch.bfloat16)
        bad.write_text("{not json")
        up_projection.measured.cache_clear()
        up_projection.switch_point.cache_clear()
        with pytest.raises(ValueError, match="switch points"):
            up_projection.switch_point(torch.device("cpu"), 4, 8, 64, 16, torch.bfloat16)
    finally:
        for f in (up_projection.measured, up_projection.switch_point):
            f.cache_clear()


def test_byte_model():
    """The byte model's crossover at DeepSeek-V3's shapes, and never where V is not below L."""
    assert up_projection.byte_model_switch(128, 512, 128, 4) == 65
    assert up_projection.byte_model_switch(128, 512, 128, 8) == 90
    assert up_projection.byte_model_switch(128, 512, 128, 1) == 1
    assert up_projection.byte_model_switch(8, 64, 64, 4) is None


@pytest.mark.parametrize("argv,words", [
    (["--batches", "0"], ">= 1"), (["--batches", ""], "one or more"),
    (["--batches", "1,1"], "repeats"), (["--world-sizes", "3"], "not divisible"),
    (["--rounds", "0"], ">= 1"), (["--heads", "x"], "not an int"),
    (["--smoke", "--write"], "--write"),
])
def test_arguments_that_mean_nothing_are_refused(bench, argv, words, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        bench.main([str(tmp_path / "r.json")] + argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err
