"""What a refusal of bad input must look like, for every implementation: the exception class the
contract allows and a message that names the problem, in any of the words engines use for it.

The contract asks for a ``ValueError`` (or, for a dtype, a ``TypeError``) naming the problem,
raised before any kernel launch or collective. It does not fix the sentence: "H=6 is not
divisible by N=4" and "H must be a multiple of the DCP world size" both name it, and a suite that
matched one phrasing would fail correct engines. Each ``*_WORDS`` pattern below is the set of
phrasings accepted for one problem; a message with none of them does not name it.

:class:`TripwireGroup` is the process group the "refused before any collective" tests hand over:
a real ``torch.distributed.ProcessGroup`` (so an implementation that validates its group first
still reaches its argument checks) whose every collective fails the test by name.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

NOT_DIVISIBLE_WORDS = r"divisib|divide|multiple of|evenly|split"
HEAD_DIM_WORDS = r"head_?dim|head dim|head_size|head size"
PACK_DIM_WORDS = r"lse_pack_dim|pack_?dim|pack dim|lanes?\b"
STRIDE_WORDS = r"contiguous|strided|strides?\b|\bout\b|\blse\b"
# "on different devices", or the devices named ("send is on meta, out on cpu")
DEVICE_WORDS = r"device|\b(cpu|cuda|meta|mps|xpu|hip)\b"


def dtype_words(dtype: torch.dtype) -> str:
    """The dtype's name (``float8_e4m3fn``) or a name engines use for its family."""
    name = str(dtype).replace("torch.", "")
    aliases = {"float64": ["double", "fp64"], "float16": ["half", "fp16"],
               "bfloat16": ["bf16"], "float32": ["fp32"]}.get(name, [])
    if name.startswith("float8"):
        aliases = ["fp8", "float8"]
    return "|".join([re.escape(name)] + aliases)


def refused(words: str, *, dtype_problem: bool = False):
    """``pytest.raises`` for a refusal: a ValueError (or TypeError where ``dtype_problem``)
    whose message matches ``words`` (case-insensitive)."""
    types = (ValueError, TypeError) if dtype_problem else ValueError
    return pytest.raises(types, match=re.compile(words, re.IGNORECASE))


def names_the_problem(message: str, words: str) -> bool:
    return re.search(words, message, re.IGNORECASE) is not None


def refused_instead(call, words: str) -> bool:
    """Run ``call()`` on input the contract lets an implementation either handle or refuse:
    True when it refused (a ValueError/TypeError that must match ``words``), False when it
    returned (the test then checks the result). Any other exception propagates."""
    try:
        call()
    except (ValueError, TypeError) as e:
        assert names_the_problem(str(e), words), \
            f"refused with a message that does not name the problem ({words}): {e}"
        return True
    return False


_COLLECTIVES = ("all_to_all_single", "alltoall_base", "alltoall", "allgather", "_allgather_base",
                "all_gather_single", "allgather_coalesced", "reduce_scatter",
                "_reduce_scatter_base", "reduce_scatter_single", "allreduce",
                "allreduce_coalesced", "broadcast", "barrier", "send", "recv", "gather",
                "scatter")


class TripwireGroup(dist.ProcessGroup):
    """Rank ``rank`` of a ``size``-rank process group that must never be used: every collective
    raises an AssertionError naming itself (the bad input should have been refused first)."""

    def __init__(self, size: int, rank: int = 0):
        super().__init__(rank, size)

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "tripwire"


def _tripped(name):
    def collective(self, *args, **kwargs):
        raise AssertionError(f"{name} reached the process group before the bad input was "
                             "refused (the contract checks arguments before any collective)")
    collective.__name__ = name
    return collective


for _name in _COLLECTIVES:
    setattr(TripwireGroup, _name, _tripped(_name))
