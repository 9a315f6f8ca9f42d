"""What the perf scripts here share besides the bench's timers: one grid point's pack inputs
and reference bytes, and a check of every variant's wire bytes before timing them
(``dcp_a2a.testing.bench.timed_rounds`` then times them in interleaved rounds)."""
import torch
from dcp_a2a.testing import straightforward as sf
from dcp_a2a.testing.bench import _inputs


def pack_point(b, h, n, d, dt):
    """(P, H/N, out, lse, send, bytes the pack moves, the straightforward pack's wire bytes)
    at one grid point, on the GPU."""
    dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dt)
    nbytes = out.numel() * es + lse.numel() * 4 + send.numel() * es
    sf.pack(out, lse, send)
    return p, hpr, out, lse, send, nbytes, send.view(torch.uint8).clone()


def check_bytes(variants, send, ref, where):
    """Run each of ``variants`` (name: callable writing ``send``) on a poisoned buffer and ask
    for ``ref``'s bytes."""
    for name, fn in variants.items():
        send.view(torch.uint8).fill_(0xFF)
        fn()
        assert torch.equal(send.view(torch.uint8), ref), (name, *where)
