"""Staging buffers for the exchange, and the rules that keep them valid under CUDA graphs.

The hazards, in the terms of PyTorch's rule for CUDA graphs (memory a graph was captured with
must stay its own while the graph can replay; memory a capture frees goes back to its pool,
where graphs captured later may place their own tensors, which is safe as long as the graphs
never run concurrently and each graph's output is consumed after its own replay), and the
rule here that rules each one out:

1. An address baked into a graph, freed to the eager allocator and taken by live tensors. A
   shared, growable workspace handed out the send/recv buffers also during capture; a later,
   larger eager call regrew it, freeing the block the graph still wrote on every replay
   (illegal memory access, or other tensors silently overwritten).
   -> Buffers handed out while a stream is capturing are never part of the eager cache: each
      capture gets its own buffers, and this owner keeps a reference to them for its whole
      lifetime. Eager growth only ever replaces eager buffers.
2. A buffer kept and handed out again while a graph that uses it can still replay. Engines
   capture one graph per batch size, several FULL-graph descriptors sharing one pool; the DCP
   staging an implementation had handed to one graph stayed in its cache and was handed out
   again (regrown by another batch size, its address recycled into other graphs' live
   buffers) while the first graph still replayed into it (garbled output on replay).
   -> Same rule: what a capture was given is pinned for that graph alone and never handed out
      again. (Allocating staging per call and letting it go, as vLLM's packed path does, is
      legal too: the pool then recycles the memory only within PyTorch's rule.)
3. The staging buffer was carved from the workspace region that also held the attention output
   being packed, so the pack kernel overwrote its own input.
   -> Buffers come from their own allocations, never from a caller's workspace, and
      ``pack_send`` refuses a send buffer that overlaps its inputs.

Eager calls reuse one grow-only pair per (device, stream, dtype, tag): the hot path allocates
nothing once the largest shape has been seen. Reuse is safe because every consumer of a receive
buffer (the combine kernel) runs on the same stream before the next call on that stream can
write it; a call on another stream gets buffers of its own (two streams sharing one pair raced:
the second call's pack overwrote what the first call's combine was still reading).
"""

from __future__ import annotations

import threading

import torch


def _storage_spans(tensors, device: torch.device) -> list:
    """The byte spans [first, one past the last) of the whole storages of ``tensors`` on
    ``device`` (None, empty tensors and tensors elsewhere left out)."""
    spans = []
    for t in tensors:
        if t is not None and t.device == device and t.numel():
            storage = t.untyped_storage()
            start = storage.data_ptr()
            spans.append((start, start + storage.nbytes()))
    return spans


def _view_span(t: torch.Tensor) -> tuple:
    """The bytes [first, one past the last) of a contiguous ``t``."""
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _as_device(device) -> torch.device:
    """``device`` as a torch.device: ValueError naming it where torch cannot read it."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, (str, int)) or isinstance(device, bool):
        raise TypeError(f"device must be a torch.device, a str or an int, got "
                        f"{type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device {device!r} is not a device torch knows: {e}") from None


def _check_request(shape, dtype, tag) -> tuple:
    """A buffer request's shape as a tuple of ints >= 0 (TypeError/ValueError naming the
    problem), before anything is allocated for it."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str, got {type(tag).__name__}")
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {type(shape).__name__}") from None
    for s in dims:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"shape {shape!r}: every dim must be an int, got "
                            f"{type(s).__name__}")
        if s < 0:
            raise ValueError(f"shape {shape!r}: every dim must be >= 0, got {s}")
    return dims


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


# The current stream's handle, the value Triton launches our kernels on, read without building
# a torch.cuda.Stream (torch.cuda.current_stream's few microseconds on every eager call, issue
# 47); the public call where this torch lacks it.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_key(device: torch.device):
    if device.type != "cuda":
        return None
    if _RAW_STREAM is not None and device.index is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


class StagingBuffers:
    """Owner of the send/recv pairs used by ``lse_reduce``. One per process (or per engine)."""

    def __init__(self) -> None:
        self._eager: dict[tuple, torch.Tensor] = {}
        # the last view handed out per eager key: (shape, view, its byte span); the decode loop
        # asks for the same shape call after call, and a view costs host time on every call
        self._views: dict[tuple, tuple] = {}
        # the last (send, recv) pair per (device, stream, dtype, tag): (shape, send, its span,
        # recv, its span), read without the lock; emptied whenever a view above is replaced
        self._pairs: dict[tuple, tuple] = {}
        self._captured: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def get(self, shape, dtype: torch.dtype, device, tag: str, avoid=()) -> torch.Tensor:
        """A contiguous scratch tensor of ``shape`` for ``tag``; never overlapping ``avoid``.

        Eager: a view of the grow-only buffer for (device, current stream, dtype, tag). While
        the current stream is capturing: a fresh tensor pinned by this owner. If the eager
        buffer overlaps one of the ``avoid`` tensors (a caller's input that lives in memory this
        owner handed out), a dedicated tensor is returned instead of corrupting that input.
        """
        if not isinstance(device, torch.device):
            device = _as_device(device)
        if _capturing(device):
            return self._pinned(shape, dtype, device)
        return self._eager_view(shape, dtype, device, tag, _storage_spans(avoid, device))

    def _pinned(self, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        t = torch.empty(_check_request(shape, dtype, ""), dtype=dtype, device=device)
        with self._lock:
            self._captured.append(t)
        return t

    def _eager_view(self, shape, dtype, device, tag, avoid_spans) -> torch.Tensor:
        key = self._eager_key(device, dtype, tag)
        shape = tuple(shape)
        with self._lock:
            hit = self._views.get(key)
            if hit is None or hit[0] != shape:
                shape = _check_request(shape, dtype, tag)  # a new request: before allocating
                numel = 1
                for s in shape:
                    numel *= int(s)
                flat = self._eager.get(key)
                if flat is None or flat.numel() < numel:
                    flat = torch.empty(numel, dtype=dtype, device=device)
                    self._eager[key] = flat
                view = flat[:numel].view(shape)
                hit = (shape, view, *_view_span(view))
                self._views[key] = hit
                self._pairs.clear()  # a pair kept may hold the view replaced
        _, view, start, end = hit
        if start != end and any(start < b1 and b0 < end for b0, b1 in avoid_spans):
            return torch.empty(shape, dtype=dtype, device=device)
        return view

    def _eager_key(self, device: torch.device, dtype: torch.dtype, tag: str) -> tuple:
        # the stream belongs in the key: two streams' calls in flight at once must not share
        # one pair (one stream's pack would overwrite what the other's combine still reads)
        return (device, _stream_key(device), dtype, tag)

    def wire_pair(self, shape, dtype: torch.dtype, device, tag: str = "wire", avoid=()):
        """A (send, recv) pair of ``shape``: contiguous, disjoint, not aliasing ``avoid``:
        ``get``'s two buffers, with what they share (the capture state, the inputs' spans)
        read once."""
        if type(self).get is not StagingBuffers.get:  # a subclass hands out its own memory
            return (self.get(shape, dtype, device, tag + ".send", avoid),
                    self.get(shape, dtype, device, tag + ".recv", avoid))
        if not isinstance(device, torch.device):
            device = _as_device(device)
        if _capturing(device):
            return self._pinned(shape, dtype, device), self._pinned(shape, dtype, device)
        spans = _storage_spans(avoid, device)
        key = self._eager_key(device, dtype, tag)
        shape = tuple(shape)
        hit = self._pairs.get(key)
        if hit is None or hit[0] != shape:
            send = self._eager_view(shape, dtype, device, tag + ".send", ())
            recv = self._eager_view(shape, dtype, device, tag + ".recv", ())
            hit = (shape, send, _view_span(send), recv, _view_span(recv))
            with self._lock:
                self._pairs[key] = hit
        _, send, (s0, s1), recv, (r0, r1) = hit
        for b0, b1 in spans:  # an input in memory a half came from: that half is its own
            if s0 < b1 and b0 < s1:
                send = torch.empty(shape, dtype=dtype, device=device)
            if r0 < b1 and b0 < r1:
                recv = torch.empty(shape, dtype=dtype, device=device)
        return send, recv

    @property
    def pinned_for_graphs(self) -> int:
        """Number of tensors kept alive for captured graphs."""
        return len(self._captured)

    def release_captured(self) -> None:
        """Drop the buffers pinned for captured graphs. Only call once those graphs are gone."""
        with self._lock:
            self._captured.clear()


_default: StagingBuffers | None = None


def default_buffers() -> StagingBuffers:
    global _default
    if _default is None:
        _default = StagingBuffers()
    return _default
