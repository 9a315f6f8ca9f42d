"""``dcp-a2a tune`` (dcp_a2a.testing.tune): the sweep that derives a card's launch table, end to
end on tiny rows (the interpreter on a CPU), with a timer that makes one candidate faster, so
that the file it writes holds a rule of its own; and its decision by interval. The speeds
themselves are the GPU's to measure, never here."""

from __future__ import annotations

import itertools
import json

import pytest

from dcp_a2a.kernels import tuning
from dcp_a2a.testing import cli, tune

pytestmark = pytest.mark.kernel


def _fast_lane_one_warp(calls=itertools.count()):
    """A timer: 100 us a call, 80 for the pack's one-warp launch with lane loads, each call
    +-1 % (so a ratio's interval has a width)."""
    def timer(fn, nbytes):
        fn()
        spec = fn.spec
        jitter = 1 + 0.01 * (next(calls) % 3 - 1)
        fast = spec.num_warps == 1 and spec.lane_loads
        return 100.0 * (0.8 if fast else 1.0) * jitter, "fake"
    return timer


def test_the_smoke_sweep_writes_a_table_that_gives_the_winner_there_only(tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.setattr(tune, "wall_timer", _fast_lane_one_warp())
    args = cli.parse(["tune", "--smoke", "--out", str(tmp_path)])
    assert tune.main(args) == 0
    (path,) = tmp_path.glob("*.json")  # named for the card: CPU_interpreter.json here
    doc = json.loads(path.read_text())
    sweep = doc["sweep"]
    assert sweep["smoke"] and sweep["base"] == "default.json" and sweep["commit"]
    pack, combine = sweep["choices"]  # float16 and bfloat16 rows make one problem each
    assert [r[4] for r in pack["rows"]] == ["float16", "bfloat16"]
    assert pack["chosen"] == "row h1 w1 d4 lane" and pack["interval"][1] < 1
    assert len(pack["times_us"]) == 2 and len(pack["times_us"][0]["table"]) == 2
    assert combine["chosen"] is None  # no candidate faster: the base's rules decide
    base = tuning.read_table("default.json")
    table = tuning.read_table(path)  # checked as a process reads it
    assert table.rules["combine"] == base.rules["combine"]
    assert table.rules["pack"][1:] == base.rules["pack"] and "why" in doc["rules"]["pack"][0]

    monkeypatch.setattr(tuning._env, "INTERPRET", False)  # the compiled rules
    monkeypatch.setattr(tuning, "ACTIVE", table.rules)
    b, h, d, n, _ = tune.SMOKE_ROWS[0]
    assert tuning.launch("pack", b, h, d // 2, n) == tuning.Launch(**pack["launch"])
    for other in ((b + 1, h, d // 2, n), (b, h, d, n), (b, h, d // 2, 2 * n)):
        assert tuning.launch("pack", *other) == tuning._compiled(
            tuning.first_launch(base.rules["pack"], *other), other[0])
    printed = capsys.readouterr().out
    assert "1 of 2 problems take another launch" in printed and str(path) in printed


def test_a_candidate_as_fast_as_the_table_does_not_replace_it():
    """By interval, not by median: a finalist whose ratio straddles 1 keeps the current choice;
    one clearly below replaces it, and the next is then judged against it."""
    rows_times = [{"table": [10.0, 10.2, 9.9, 10.1], "same": [9.9, 10.3, 9.8, 10.2],
                   "fast": [9.0, 9.2, 8.9, 9.1], "faster": [8.1, 8.3, 8.0, 8.2]}]
    chosen, _, (step,) = tune.decide(rows_times, ["same"], 0.95)
    lo, hi = step["interval"]
    assert chosen == "table" and lo < 1 < hi and not step["replaces"]
    chosen, (lo, hi), steps = tune.decide(rows_times, ["same", "fast", "faster"], 0.95)
    assert chosen == "faster" and hi < 0.85
    assert [s["over"] for s in steps] == ["table", "faster", "faster"]


def test_the_sweep_refuses_what_it_cannot_do(tmp_path, capsys):
    if not __import__("torch").cuda.is_available():
        assert tune.main(cli.parse(["tune", "--out", str(tmp_path)])) == 3
    assert tune.main(cli.parse(["tune", "--smoke"])) == 2
    assert tune.main(cli.parse(
        ["tune", "--smoke", "--out", str(tmp_path), "--base", "NO_SUCH.json"])) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_the_invariance_count_grows_with_a_table_that_adds_launches(monkeypatch):
    """The summary's count of launches the bit-for-bit test runs (what a new table costs the
    gpu-check): a rule giving a launch no shipped table gives adds to it; the shipped rules
    add nothing."""
    monkeypatch.setattr(tuning._env, "INTERPRET", False)
    now = tune.invariance_launches()
    assert tune.invariance_launches(tuning.H200.rules) == now > 0
    odd = tuning.Rule(float("inf"), 64, 2048, 16)  # 64-lane tiles, 16 warps: no table's
    assert tune.invariance_launches({"combine": (odd,)}) > now


def test_a_new_sweep_replaces_an_earlier_sweeps_rule_for_its_problem(tmp_path):
    """Sweeping a card again with its own table as the base: the new exact rule goes in front
    and the earlier one of the same bounds (unreachable now) is left out; the base's other
    rules stay, in their order."""
    problem = dict(batch=64, heads=16, head_lanes=256, ranks=8, slab_ok=False)
    old = tuning.exact_rule("combine", tuning.Launch(1, 256, 2), *problem.values())
    base_doc = {"format": 1, "card": None, "rules": {
        "combine": [tuning.rule_to_json(old)] + [tuning.rule_to_json(r)
                                                  for r in tuning.H200.rules["combine"]]},
        "base": str(tuning.TABLES_DIR / "NVIDIA_H200.json")}
    (tmp_path / "base.json").write_text(json.dumps(base_doc))
    base = tuning.read_table(tmp_path / "base.json")
    new = tuning.Launch(1, 256, 4)
    choice = {"kind": "combine", "rows": [[64, 128, 512, 8, "bfloat16"]], "problem": problem,
              "table_launch": tune.launch_name(tuning.Launch(1, 256, 2)),
              "chosen": tune.launch_name(new), "launch": vars(new).copy(),
              "over_table": 0.9, "interval": [0.88, 0.92]}
    card = {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "sms": 132}
    doc = tune.derive_table(base, [choice], card, {"date": "2026-12-07", "commit": "abc",
                                                    "confidence": 0.95})
    path = tune.write_table(doc, tmp_path)
    assert path.name == "NVIDIA_H100_80GB_HBM3.json"
    rules = tuning.read_table(path).rules["combine"]
    assert rules[1:] == tuning.H200.rules["combine"] and old not in rules
    assert rules[0].launch(64, 16, 256, 8) == new and "sweep at 64 128 512 8" in \
        json.loads(path.read_text())["rules"]["combine"][0]["why"]
