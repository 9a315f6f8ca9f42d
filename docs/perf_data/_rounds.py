"""What the perf scripts here share besides the bench's timers: check every variant's wire bytes
before timing them (``dcp_a2a.testing.bench.timed_rounds`` then times them in interleaved
rounds)."""
import torch


def check_bytes(variants, send, ref, where):
    """Run each of ``variants`` (name: callable writing ``send``) on a poisoned buffer and ask
    for ``ref``'s bytes."""
    for name, fn in variants.items():
        send.view(torch.uint8).fill_(0xFF)
        fn()
        assert torch.equal(send.view(torch.uint8), ref), (name, *where)
