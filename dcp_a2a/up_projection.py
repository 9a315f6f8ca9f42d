"""Where the MLA up-projection goes around the exchange: the switch point, per card.

``lse_reduce(out, lse, group, w_uv=W)`` merges latent partials ``out[B, H, L]`` and projects
them by ``W[H, L, V]`` (per head). Two orders give the same result up to rounding, because the
merge is linear per head:

``"before_exchange"``  every rank projects its partial (all H heads, all of W), the exchange
                       carries V + P lanes a head;
``"after_merge"``      the exchange carries the latent L + P lanes a head, and each rank projects
                       its own merged heads (H/N of them, its W[r H/N : (r+1) H/N]).

Projecting first reads all of W (H L V values) where the other reads 1/N of it, and moves
fewer bytes from then on (V instead of L lanes a head: the pack, the wire and the combine):
it wins from some batch size B on. ``"auto"`` (the default) projects first exactly when
B >= :func:`switch_point`, a threshold:

* a card measured by ``benchmarks/benchmark_up_projection.py --write`` (its name, else its
  compute capability, at the shape it was measured at: heads, latent and value widths, dtype)
  takes the measured number of its group size from ``up_projection_switch.json``;
* any other card, shape or group size, and the CPU, takes the byte model of the local work
  (:func:`byte_model_switch`): the bytes both orders move through memory on one rank.

Neither counts the wire, which only favours projecting first (it carries (L - V)/(L + P) fewer
bytes): on real ranks the best switch is at or below these numbers.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch

ORDERS = ("auto", "before_exchange", "after_merge")
DATA_FILE = Path(__file__).with_name("up_projection_switch.json")
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def byte_model_switch(heads: int, latent: int, value: int, world_size: int) -> int | None:
    """The smallest B at which projecting first moves fewer bytes on one rank, or None where it
    never does.

    Per rank, in elements of the output dtype (the LSE lanes P cancel out): projecting first
    reads W (H L V), x (B H L), writes and packs the projected partial (2 B H V), sends and
    combines V + P lanes a head (2 B H (V + P)) and writes B H/N V; merging first packs x
    (B H L), sends and combines L + P lanes (2 B H (L + P)), writes and reads the merged latent
    (2 B H/N L), reads its W (H/N L V) and writes B H/N V. Projecting first costs
    H L V (1 - 1/N) more for W and saves B H (2L - 4V + 2L/N): it wins where
    B > L V (1 - 1/N) / (2L - 4V + 2L/N)."""
    saved_per_token = 2 * latent - 4 * value + 2 * latent / world_size
    if saved_per_token <= 0:
        return None
    return math.floor(latent * value * (1 - 1 / world_size) / saved_per_token) + 1


@functools.lru_cache(maxsize=None)
def measured() -> tuple:
    """The measured cards of ``up_projection_switch.json`` (a tuple of dicts, possibly empty).
    A file that cannot be read is a ValueError naming it: a switch point silently lost would
    move every call of that card to the byte model."""
    try:
        data = json.loads(DATA_FILE.read_text())
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the up-projection switch points {DATA_FILE}: {e}") from e
    cards = data.get("cards", [])
    if not isinstance(cards, list):
        raise ValueError(f"{DATA_FILE}: 'cards' must be a list")
    return tuple(cards)


@functools.lru_cache(maxsize=64)
def _card(device: torch.device) -> tuple[str, str] | None:
    """(name, compute capability "M.m") of a CUDA device, None for any other."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), f"{major}.{minor}"


def _matches(entry: dict, heads: int, latent: int, value: int, dtype: torch.dtype) -> bool:
    shape = entry.get("shape", {})
    return (shape.get("heads") == heads and shape.get("latent") == latent
            and shape.get("value") == value and shape.get("dtype") == _DTYPE_NAMES.get(dtype))


@functools.lru_cache(maxsize=4096)
def switch_point(device: torch.device, world_size: int, heads: int, latent: int, value: int,
                 dtype: torch.dtype) -> int | None:
    """The B from which ``up_proj="auto"`` projects before the exchange (None: never), for a
    call on ``device`` in a group of ``world_size`` with ``heads`` heads (all of them, H),
    latent width ``latent`` (L), value width ``value`` (V) and output ``dtype``: a measured
    card's number where there is one (see the module), else the byte model."""
    card = _card(device)
    if card is not None:
        name, capability = card
        for by in ("name", "capability"):
            want = name if by == "name" else capability
            for entry in measured():
                tokens = entry.get("min_tokens", {})
                if (entry.get(by) == want and _matches(entry, heads, latent, value, dtype)
                        and str(world_size) in tokens):
                    got = tokens[str(world_size)]
                    if got is None or (type(got) is int and got >= 1):
                        return got
                    raise ValueError(f"{DATA_FILE}: {want}'s min_tokens[{world_size}] is "
                                     f"{got!r}: expected an int >= 1, or null for never")
    return byte_model_switch(heads, latent, value, world_size)


# torch.compile calls it while tracing and keeps its result as a constant of the graph (no trace
# of the data file's reading); eagerly it is switch_point itself
_traced_switch_point = torch.compiler.assume_constant_result(
    lambda device, world_size, heads, latent, value, dtype:
    switch_point(device, world_size, heads, latent, value, dtype))


def choose(up_proj: str, batch: int, world_size: int, device: torch.device, heads: int,
           latent: int, value: int, dtype: torch.dtype) -> str:
    """``"before_exchange"`` or ``"after_merge"``: ``up_proj`` itself unless it is "auto"."""
    if up_proj != "auto":
        return up_proj
    if torch.compiler.is_dynamo_compiling():
        at = _traced_switch_point(device, world_size, heads, latent, value, dtype)
    else:
        at = switch_point(device, world_size, heads, latent, value, dtype)
    return "before_exchange" if at is not None and batch >= at else "after_merge"
