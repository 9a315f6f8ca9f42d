"""Minimal reproducers: the calls a failing test made into the implementation, as a few lines of
Python with the numbers.

Every call of a contract function through :class:`dcp_a2a.testing.impl.Implementation` is
recorded (the last :data:`KEEP` of the running test): its arguments as they were when the call
began. A CPU tensor of at most :data:`MAX_VALUES` elements keeps its values (a strided view: the
storage it spans and its strides, so a view sliced from a table stays a view); a larger or CUDA
tensor keeps its shape, dtype and strides (copying a CUDA tensor would synchronise the stream
and could hide the very races the graphs clause looks for). :func:`render` turns the record into
a script that loads the implementation and repeats the calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

KEEP = 8
MAX_VALUES = 4096


@dataclass
class TensorArg:
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: str
    storage: list | None   # the values of the storage span the view reads, or None
    offset: int = 0        # where the view starts in that span

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Call:
    name: str
    args: tuple
    kwargs: dict


_calls: list[Call] = []


def clear() -> None:
    _calls.clear()


def calls() -> list[Call]:
    return list(_calls)


def _capturing() -> bool:
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except RuntimeError:
        return False


def _snapshot(x):
    if isinstance(x, torch.Tensor):
        storage = None
        offset = 0
        if (x.device.type == "cpu" and x.layout == torch.strided and not x.is_meta
                and x.numel() <= MAX_VALUES):
            if x.numel() == 0:
                storage = []
            else:
                span = 1 + sum((s - 1) * abs(st) for s, st in zip(x.shape, x.stride()))
                if span <= MAX_VALUES and all(st >= 0 for st in x.stride()):
                    base = torch.as_strided(x.detach(), (span,), (1,))
                    storage = base.to(torch.float64 if x.is_floating_point() else torch.int64
                                      ).tolist()
        return TensorArg(tuple(x.shape), tuple(x.stride()), x.dtype, x.device.type, storage,
                         offset)
    if isinstance(x, (list, tuple)):
        return type(x)(_snapshot(v) for v in x)
    if isinstance(x, (bool, int, float, str, type(None), torch.dtype)):
        return x
    return _Opaque(x)


class _Opaque:
    """An argument rendered by description (a process group, a group object)."""

    def __init__(self, x):
        ws = getattr(x, "world_size", None)
        rk = getattr(x, "rank_in_group", None)
        if ws is not None:
            self.text = f"group  # a group object: world_size={ws}, rank_in_group={rk}"
        else:
            self.text = f"{type(x).__name__}(...)  # {type(x).__module__}"


def record(name: str, args: tuple, kwargs: dict) -> None:
    if _capturing():
        return
    try:
        _calls.append(Call(name, tuple(_snapshot(a) for a in args),
                           {k: _snapshot(v) for k, v in kwargs.items()}))
    except Exception:  # a reproducer is a courtesy: recording never fails a test
        return
    del _calls[:-KEEP]


def _num(v: float, is_float: bool) -> str:
    if not is_float:
        return str(int(v))
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def _tensor_expr(t: TensorArg) -> str:
    dtype = str(t.dtype)
    dev = "" if t.device == "cpu" else f", device={t.device!r}"
    if t.storage is None:
        where = "" if t.device == "cpu" else f" on {t.device}"
        return (f"torch.empty({list(t.shape)}, dtype={dtype}{dev})  # values not kept "
                f"({t.numel} elements{where}): rerun the test")
    is_float = t.dtype.is_floating_point
    values = "[" + ", ".join(_num(v, is_float) for v in t.storage) + "]"
    base = f"torch.tensor({values}, dtype={dtype}{dev})"
    contiguous_stride = []
    acc = 1
    for s in reversed(t.shape):
        contiguous_stride.insert(0, acc)
        acc *= s
    if list(t.stride) == contiguous_stride and len(t.storage) == t.numel:
        return f"{base}.view({list(t.shape)})" if len(t.shape) != 1 else base
    return f"{base}.as_strided({list(t.shape)}, {list(t.stride)})"


def _expr(x) -> str:
    if isinstance(x, TensorArg):
        return _tensor_expr(x)
    if isinstance(x, _Opaque):
        return x.text.split("  #")[0]
    if isinstance(x, torch.dtype):
        return str(x)
    if isinstance(x, float):
        return _num(x, True)
    if isinstance(x, list):
        return "[" + ", ".join(_expr(v) for v in x) + "]"
    if isinstance(x, tuple):
        return "(" + ", ".join(_expr(v) for v in x) + ("," if len(x) == 1 else "") + ")"
    return repr(x)


def size(recorded: list[Call]) -> int:
    """How many input elements the calls carry (smaller: a more minimal reproducer)."""
    total = 0
    for c in recorded:
        for v in list(c.args) + list(c.kwargs.values()):
            if isinstance(v, TensorArg):
                total += v.numel
    return total


def render(recorded: list[Call], spec: str, failure: str, nodeid: str = "") -> str:
    """A script that loads ``spec`` and repeats ``recorded``'s calls; the failure text follows
    as a comment."""
    lines = ["import torch", "from dcp_a2a.testing.impl import load_impl", "",
             'inf, nan = float("inf"), float("nan")', f"impl = load_impl({spec!r})"]
    notes = []
    for i, c in enumerate(recorded):
        names = []
        for j, a in enumerate(c.args):
            name = f"a{i}_{j}"
            if isinstance(a, TensorArg):
                lines.append(f"{name} = {_tensor_expr(a)}")
                names.append(name)
            else:
                if isinstance(a, _Opaque):
                    notes.append(a.text)
                names.append(_expr(a))
        kw = []
        for k, v in c.kwargs.items():
            if isinstance(v, TensorArg):
                lines.append(f"{k}_{i} = {_tensor_expr(v)}")
                kw.append(f"{k}={k}_{i}")
            else:
                if isinstance(v, _Opaque):
                    notes.append(v.text)
                kw.append(f"{k}={_expr(v)}")
        lines.append(f"r{i} = impl.{c.name}({', '.join(names + kw)})")
    head = [f"# reproducer: {nodeid}" if nodeid else "# reproducer"]
    head += [f"# {n}" for n in dict.fromkeys(notes)]
    tail = ["", "# the test saw:"] + [f"#   {ln}" for ln in failure.strip().splitlines()[:12]]
    return "\n".join(head + lines + tail) + "\n"
