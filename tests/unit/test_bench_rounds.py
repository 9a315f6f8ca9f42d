"""The benchmark's interleaved timing rounds and its graph warm-up (host logic only: a fake
timer, or fake CUDA events, stand in for the GPU's)."""

from __future__ import annotations

import pytest

from dcp_a2a.testing.bench_grid import grid_table
from dcp_a2a.testing.timing import ratio_verdict, timed_rounds, timed_verdicts

pytestmark = pytest.mark.unit


def test_rounds_interleave_the_variants_and_report_medians():
    calls = []
    times = {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 9.0, 4.0])}

    def timer(fn, nbytes):
        name = fn()
        calls.append((name, nbytes))
        return next(times[name]), "graph"

    med, rounds, method = timed_rounds({"a": lambda: "a", "b": lambda: "b"}, 64, 3, timer)
    assert calls == [("a", 64), ("b", 64)] * 3  # one of each a round, not three of a then b
    assert med == {"a": 3.0, "b": 4.0} and rounds == {"a": [5.0, 1.0, 3.0], "b": [2.0, 9.0, 4.0]}
    assert method == "graph"


def _rounds(ratios, base=10.0):
    """Per-round (ours, straightforward) times whose round-by-round ratios are ``ratios``, with
    the machine drifting between rounds (the pairing must cancel it)."""
    drift = [1.0, 1.3, 0.8, 1.1, 0.9, 1.2, 1.0, 0.85, 1.15][: len(ratios)]
    return [r * base * k for r, k in zip(ratios, drift)], [base * k for k in drift]


def test_verdict_is_met_only_when_the_interval_is_below_the_target():
    ours, sf = _rounds([0.90, 0.91, 0.89])
    lo, hi, v = ratio_verdict(ours, sf, 0.95)
    assert v == "met" and lo < 0.90 < hi < 0.95
    # the same typical ratio, noisier rounds: the interval reaches past 0.95
    assert ratio_verdict(*_rounds([0.80, 1.00, 0.90]), 0.95)[2] == "undecided"
    assert ratio_verdict(*_rounds([0.99, 1.01, 1.00]), 0.95)[2] == "missed"


def test_verdict_pairs_rounds_so_drift_cancels():
    # round to round the machine drifts by 1.6x; ours is 0.9x in every round
    lo, hi, v = ratio_verdict(*_rounds([0.9, 0.9, 0.9]), 0.95)
    assert v == "met" and lo == pytest.approx(0.9) and hi == pytest.approx(0.9)
    # a hair either side of the target, in every round
    assert ratio_verdict(*_rounds([0.949] * 3), 0.95)[2] == "met"
    assert ratio_verdict(*_rounds([0.951] * 3), 0.95)[2] == "missed"


def test_verdict_on_one_round_is_undecided_and_bad_rounds_are_refused():
    lo, hi, v = ratio_verdict([1.0], [2.0], 0.95)
    assert v == "undecided" and lo != lo and hi != hi  # nan: no interval from one round
    with pytest.raises(ValueError, match="as many rounds"):
        ratio_verdict([1.0, 2.0], [1.0], 0.95)
    with pytest.raises(ValueError, match="as many rounds"):
        ratio_verdict([], [], 0.95)


def _timer_of(ratios):
    """A fake timer: "sf" takes 10 us, "ours" ratios[i] x 10 in its i-th call."""
    seen = {"sf": 0, "ours": 0}

    def timer(fn, nbytes):
        name = fn()
        i, seen[name] = seen[name], seen[name] + 1
        return (10.0 if name == "sf" else 10.0 * ratios[i]), "graph"
    return timer, seen


def test_undecided_ops_are_timed_again_up_to_settle_rounds():
    variants = {"sf": lambda: "sf", "ours": lambda: "ours"}
    # three rounds straddle 0.95; six more at 0.90 settle it
    timer, seen = _timer_of([0.85, 1.00, 0.92] + [0.90] * 6)
    med, times, _, verdicts = timed_verdicts(variants, 64, ["ours"], 3, 9, 0.95, timer)
    assert seen == {"sf": 9, "ours": 9} and len(times["ours"]) == len(times["sf"]) == 9
    assert verdicts["ours"][2] == "met" and med["ours"] == pytest.approx(9.0)
    # decided after three: no more rounds
    timer, seen = _timer_of([0.90, 0.91, 0.89])
    _, times, _, verdicts = timed_verdicts(variants, 64, ["ours"], 3, 9, 0.95, timer)
    assert seen == {"sf": 3, "ours": 3} and verdicts["ours"][2] == "met"
    # still undecided after nine: reported so, never a tenth round
    timer, seen = _timer_of([0.85, 1.05] * 5)
    _, _, _, verdicts = timed_verdicts(variants, 64, ["ours"], 3, 9, 0.95, timer)
    assert seen["ours"] == 9 and verdicts["ours"][2] == "undecided"
    # settle_rounds not above rounds: one look only
    timer, seen = _timer_of([0.85, 1.00, 0.92])
    _, _, _, verdicts = timed_verdicts(variants, 64, ["ours"], 3, 0, 0.95, timer)
    assert seen["ours"] == 3 and verdicts["ours"][2] == "undecided"


def test_grid_table_reports_each_verdict_and_lists_what_is_not_met():
    def row(b, verdict, ci, rounds):
        r = {"B": b, "H": 64, "N": 4, "D": 512, "dtype": "float32", "rounds": 3, "target": 0.95}
        for op in ("pack", "unpack"):
            r.update({f"{op}_us": 9.0, f"{op}_straightforward_us": 10.0, f"{op}_copy_us": 8.0,
                      f"{op}_ratio": 0.9, f"{op}_pct_copy": 80.0, f"{op}_spread": 1.02,
                      f"{op}_verdict": "met", f"{op}_ratio_ci": [0.88, 0.92], f"{op}_rounds": 3})
        r.update({"pack_verdict": verdict, "pack_ratio_ci": ci, "pack_rounds": rounds})
        return r

    text = grid_table([row(1, "met", [0.88, 0.92], 3), row(4, "undecided", [0.93, 0.97], 9),
                       row(16, "missed", [0.96, 0.99], 9)])
    assert "pack 1 met, 1 undecided, 1 missed; unpack 3 met, 0 undecided, 0 missed" in text
    assert "(2 ops, undecided after them, timed again: up to 9 rounds)" in text
    listed = [line.split() for line in text.split("\nnot met (")[1].splitlines()[1:]]
    assert [(w[0], w[1], w[2]) for w in listed] == [("undecided", "pack", "B=4"),
                                                   ("missed", "pack", "B=16")]
    assert "[0.930, 0.970] over 9 rounds; copy x 1.125, target copy x 1.188\n" in text
    # the target over the copy: 0.95 x sf / copy, flagged where it is below the copy's time
    slow_copy = row(32, "missed", [0.96, 0.99], 9)
    slow_copy["pack_copy_us"] = 9.6
    assert text.endswith("target copy x 1.188")
    assert grid_table([slow_copy]).endswith(
        "copy x 0.938, target copy x 0.990 (below the copy)")


def test_grid_table_reports_the_engine_design_unpack():
    """The unpack's engine-design baseline gets its columns and a summary line;
    rows timed before it was in the grid still print, its columns blank."""
    def row(b, eng_us, verdict):
        r = {"B": b, "H": 128, "N": 8, "D": 512, "dtype": "bfloat16", "rounds": 3,
             "target": 0.95}
        for op in ("pack", "unpack"):
            r.update({f"{op}_us": 9.0, f"{op}_straightforward_us": 10.0, f"{op}_copy_us": 8.0,
                      f"{op}_ratio": 0.9, f"{op}_pct_copy": 80.0, f"{op}_spread": 1.02,
                      f"{op}_verdict": "met", f"{op}_ratio_ci": [0.88, 0.92], f"{op}_rounds": 3})
        if eng_us is not None:
            r.update({"unpack_engine_us": eng_us, "unpack_engine_ratio": 9.0 / eng_us,
                      "unpack_engine_verdict": verdict})
        return r

    text = grid_table([row(64, 8.0, "missed"), row(128, 10.0, "met"), row(256, None, None)])
    lines = text.splitlines()
    assert lines[0].endswith("|   eng us   /eng    v")
    assert lines[2].endswith("|     8.00  1.125 MISS") and lines[3].endswith("|    10.00  0.900   ok")
    assert lines[4].count("|") == 2  # the older row: no engine columns
    assert ("unpack vs the engine design (at most 1.0 x its time): 1 met, 0 undecided, 1 missed;"
            " worst ratio 1.125 at B=64 H=128 N=8 D=512 bfloat16") in text
    assert "engine design" not in grid_table([row(256, None, None)])


def test_warm_up_lasts_the_time_asked_when_the_first_replay_is_slow(monkeypatch):
    """The graph's first replay also uploads it (0.3 ms here, then 0.2 ms a replay). A warm-up
    counted from that replay ran 13.7 of the 20 ms asked. The untimed replays must add up to
    the time asked at the usual replay's pace. (Fake CUDA events on a fake clock.)"""
    from dcp_a2a.testing import timing

    clock = {"ms": 0.0, "replays": 0}

    def replay():
        clock["ms"] += 0.3 if clock["replays"] == 0 else 0.2
        clock["replays"] += 1

    class Event:
        def __init__(self, enable_timing=False):
            self.ms = None

        def record(self):
            self.ms = clock["ms"]

        def elapsed_time(self, end):
            return end.ms - self.ms

    monkeypatch.setattr(timing.torch.cuda, "Event", Event)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda *a: None)
    timing._warm_up(replay, 20.0)
    assert (clock["replays"] - 1) * 0.2 >= 20.0, clock
    clock.update(ms=0.0, replays=0)
    timing._warm_up(replay, 0.0)
    assert clock["replays"] == 0  # none asked, none run
