"""The staging owner's eager views (dcp_a2a.buffers): each buffer of a wire pair avoids the
caller's inputs (their whole storage), the two never overlap, a repeated shape gets the same
memory, and a subclass that hands out its own memory through ``get`` is asked for both halves.
CPU tensors; what a capture pins is the GPU tier's (tests/gpu/test_graphs.py)."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a import StagingBuffers

pytestmark = pytest.mark.unit

SHAPE, DT = (2, 3, 4, 10), torch.bfloat16


def _span(t):
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _meet(a, b):
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def test_a_pair_is_disjoint_and_kept_for_its_shape():
    bufs = StagingBuffers()
    send, recv = bufs.wire_pair(SHAPE, DT, "cpu")
    assert send.shape == recv.shape == SHAPE and send.is_contiguous() and recv.is_contiguous()
    assert not _meet(send, recv)
    again = bufs.wire_pair(SHAPE, DT, "cpu")
    assert [t.data_ptr() for t in again] == [send.data_ptr(), recv.data_ptr()]


@pytest.mark.parametrize("half", ["send", "recv"])
@pytest.mark.parametrize("where", ["inside", "elsewhere in its storage"])
def test_each_half_avoids_an_input_in_its_memory(half, where):
    """An input that lives in the memory a half was handed out from (the caller reused it):
    that half comes from an allocation of its own, the other half stays. The owner's buffers
    first grew for a larger shape, so a half is a view of part of its storage: an input in the
    rest of that storage counts too (its bytes miss the half, its storage does not)."""
    bufs = StagingBuffers()
    bufs.wire_pair((4, *SHAPE[1:]), DT, "cpu")
    pair = dict(zip(("send", "recv"), bufs.wire_pair(SHAPE, DT, "cpu")))
    mine = pair[half]
    whole = torch.empty(0, dtype=DT).set_(mine.untyped_storage())
    assert whole.numel() > mine.numel()
    inp = mine.view(-1)[:8] if where == "inside" else whole[-1:]
    assert where == "inside" or not _meet(inp, mine)
    got = dict(zip(("send", "recv"), bufs.wire_pair(SHAPE, DT, "cpu", avoid=(inp, None))))
    assert not _meet(got[half], whole), f"{half} handed out over the input's storage"
    other = "recv" if half == "send" else "send"
    assert got[other].data_ptr() == pair[other].data_ptr(), "the other half moved"
    assert not _meet(got["send"], got["recv"])


def test_a_subclass_get_is_asked_for_both_halves():
    asked = []

    class Counting(StagingBuffers):
        def get(self, shape, dtype, device, tag, avoid=()):
            asked.append(tag)
            return super().get(shape, dtype, device, tag, avoid)

    Counting().wire_pair(SHAPE, DT, "cpu", tag="data")
    assert asked == ["data.send", "data.recv"]


def test_a_pair_follows_its_halves_when_they_regrow():
    """``get`` of one half at a larger shape replaces that half's buffer: the pair handed out
    next is carved from the new buffer (one buffer per half, not one per shape ever seen)."""
    bufs = StagingBuffers()
    bufs.wire_pair(SHAPE, DT, "cpu")
    grown = bufs.get((8, *SHAPE[1:]), DT, "cpu", "wire.send")
    send, recv = bufs.wire_pair(SHAPE, DT, "cpu")
    assert send.untyped_storage().data_ptr() == grown.untyped_storage().data_ptr()
    assert send.data_ptr() == bufs.get(SHAPE, DT, "cpu", "wire.send").data_ptr()
    assert not _meet(send, recv)
