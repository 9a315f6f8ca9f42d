"""What the perf scripts here share: check every variant's wire bytes, then time the variants in
interleaved rounds (a round times each once; the spread between rounds is the noise)."""
import statistics

import torch

from dcp_a2a.testing.bench import time_us


def check_bytes(variants, send, ref, where):
    """Run each of ``variants`` (name: callable writing ``send``) on a poisoned buffer and ask
    for ``ref``'s bytes."""
    for name, fn in variants.items():
        send.view(torch.uint8).fill_(0xFF)
        fn()
        assert torch.equal(send.view(torch.uint8), ref), (name, *where)


def timed_rounds(variants, nbytes, rounds=3):
    """(median us by name, every round's us by name)."""
    times = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(time_us(fn, nbytes)[0])
    return {k: statistics.median(v) for k, v in times.items()}, times
