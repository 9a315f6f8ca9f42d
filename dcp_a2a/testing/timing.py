"""How the benchmarks time a kernel and judge it against a baseline.

Small problems are timed as CUDA-graph replays of many back-to-back calls (below
``GRAPH_BYTES_LIMIT`` moved), after ``WARMUP_MS`` of untimed replays; large ones with
``triton.testing.do_bench`` (median of event-timed runs). Variants compared with each other are
timed in interleaved rounds (a drift of the machine reaches every variant alike), and a
verdict on "ours at most ``target`` x the baseline" comes from a confidence interval of the
per-round ratio (:func:`ratio_verdict`), taken again on more rounds where it is undecided
(:func:`timed_verdicts`). The device copy bandwidth (:func:`copy_bandwidth`) is the roofline
every row is reported against.
"""

from __future__ import annotations

import math
import statistics

import torch

# Below this many bytes moved, time CUDA-graph replays: kernels of up to ~250 us would otherwise
# be timed with the host's launch overhead in them (the decode path runs under graphs).
GRAPH_BYTES_LIMIT = 1 << 30


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    import triton.testing

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300,
                                 return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9


# Graph replays timed with no warm-up read up to 11 % slow (the quick benchmark's B=8192 unpack,
# timed right after its kernel's first call; docs/perf_history.md, twelfth pass): the graph is
# replayed untimed for this long before the timed replays, as do_bench warms up for 25 ms.
WARMUP_MS = 25.0


WARMUP_MAX_CALLS = 10_000  # a call timed at ~0 would otherwise ask for no end of calls


def _warm_up_calls(ms: float, ms_per_call: float) -> int:
    """Calls of ``ms_per_call`` that make up at least ``ms`` (at most WARMUP_MAX_CALLS)."""
    return 0 if ms <= 0 else min(WARMUP_MAX_CALLS, math.ceil(ms / max(ms_per_call, 1e-3)))


def _warm_up(replay, ms: float) -> None:
    """Run ``replay`` untimed until ``ms`` milliseconds of GPU time have passed (at most
    WARMUP_MAX_CALLS replays), measured with events around batches that double. A count taken
    from the first replay alone fell short, because that replay also uploads the graph and is
    slower than the rest: an H100 warmed up for 17.8 of the 20 ms asked."""
    done, calls, batch = 0.0, 0, 1
    while done < ms and calls < WARMUP_MAX_CALLS:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            replay()
        b.record()
        torch.cuda.synchronize()
        done, calls, batch = done + a.elapsed_time(b), calls + batch, min(2 * batch, 1024)


def time_us(fn, nbytes: int, reps_in_graph: int | None = None,
            warmup_ms: float | None = None) -> tuple[float, str]:
    """Median microseconds per call: CUDA-graph replays of back-to-back calls below
    GRAPH_BYTES_LIMIT moved (fewer calls per graph for bigger ones), after ``warmup_ms``
    (default WARMUP_MS) of untimed replays; events above (``do_bench``, which warms up alike)."""
    import triton.testing

    if nbytes >= GRAPH_BYTES_LIMIT:
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        return ms * 1e3, "events"
    if reps_in_graph is None:
        reps_in_graph = max(2, min(50, (256 << 20) // max(nbytes, 1)))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps_in_graph):
            fn()
    _warm_up(g.replay, WARMUP_MS if warmup_ms is None else warmup_ms)
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps_in_graph)
    times.sort()
    return times[len(times) // 2], "graph"


def timed_rounds(variants: dict, nbytes: int, rounds: int = 3, timer=None):
    """Time each of ``variants`` (name: callable moving ``nbytes``) once a round, ``rounds``
    rounds, interleaved (a drift of the machine then reaches every variant alike): (median us
    by name, every round's us by name, how they were timed). ``timer``: ``time_us``'s
    signature, for tests."""
    timer = timer or time_us
    times, method = {k: [] for k in variants}, None
    for _ in range(rounds):
        for name, fn in variants.items():
            us, method = timer(fn, nbytes)
            times[name].append(us)
    return {k: statistics.median(v) for k, v in times.items()}, times, method


# The speed target: at every grid point ours at most this times the straightforward time.
TARGET_RATIO = 0.95


# The unpack at most the engine-design kernel's time (no slower than the engine).
ENGINE_TARGET = 1.0


def ratio_verdict(ours, base, target=TARGET_RATIO, confidence=0.95):
    """Is ``ours`` at most ``target`` x ``base``? ``ours`` and ``base`` are per-round times of
    the same interleaved rounds, so round i's ratio ``ours[i] / base[i]`` is paired (a drift of
    the machine during a round reaches both). The ratios' logs get a one-sample t interval
    (scipy.stats.ttest_1samp) at ``confidence``; exponentiated, (lo, hi) bound the ratios'
    geometric mean. Verdict "met" if hi <= target, "missed" if lo > target, otherwise "undecided". With
    one round there is no interval: (nan, nan, "undecided")."""
    import warnings

    import numpy as np
    from scipy import stats

    if len(ours) != len(base) or not ours:
        raise ValueError(f"need as many rounds of ours as of base, got {len(ours)} and "
                         f"{len(base)}")
    logs = np.log(np.asarray(ours, dtype=float)) - np.log(np.asarray(base, dtype=float))
    if len(logs) < 2:
        return float("nan"), float("nan"), "undecided"
    with warnings.catch_warnings():  # equal ratios every round: a zero-width interval
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.exp(stats.ttest_1samp(logs, 0.0).confidence_interval(confidence))
    if np.isnan(lo):  # every round the same ratio: its interval is that ratio
        lo = hi = float(np.exp(logs[0]))
    verdict = "met" if hi <= target else "missed" if lo > target else "undecided"
    return float(lo), float(hi), verdict


def timed_verdicts(variants: dict, nbytes: int, judged, rounds: int, settle_rounds: int = 0,
                   target: float = TARGET_RATIO, timer=None):
    """``timed_rounds`` of ``variants`` (one of them named "sf", the straightforward kernel),
    then a ``ratio_verdict`` of each name in ``judged`` against "sf". If any is undecided and
    ``settle_rounds`` > ``rounds``, every variant gets ``settle_rounds - rounds`` more rounds
    and the verdicts are taken again on all of them (two looks at the data, no more: a
    verdict is not fished for; by Bonferroni the two looks at most double a wrong verdict's
    chance, 2.5 % a side at 95 %). Returns (medians, every round's times, timing method,
    {name: (lo, hi, verdict)})."""
    med, times, method = timed_rounds(variants, nbytes, rounds, timer)

    def judge():
        return {k: ratio_verdict(times[k], times["sf"], target) for k in judged}

    verdicts = judge()
    if settle_rounds > rounds and any(v[2] == "undecided" for v in verdicts.values()):
        _, more, method = timed_rounds(variants, nbytes, settle_rounds - rounds, timer)
        for k in times:
            times[k] += more[k]
        med = {k: statistics.median(v) for k, v in times.items()}
        verdicts = judge()
    return med, times, method, verdicts

