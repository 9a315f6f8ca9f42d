"""What a refusal of bad input must look like, for every implementation: the exception class the
contract allows and a message that names the problem, in any of the words engines use for it.

The contract asks for a ``ValueError`` (or, for a dtype, a ``TypeError``) naming the problem,
raised before any kernel launch or collective. Accepting bad input is a defect; refusing it in
another form (another exception type, other words) is a difference of convention. It does not fix the sentence: "H=6 is not
divisible by N=4" and "H must be a multiple of the DCP world size" both name it, and a suite that
matched one phrasing would fail correct engines. Each ``*_WORDS`` pattern below is the set of
phrasings accepted for one problem; a message with none of them does not name it.

:class:`TripwireGroup` is the process group the "refused before any collective" tests hand over:
a real ``torch.distributed.ProcessGroup`` (so an implementation that validates its group first
still reaches its argument checks) whose every collective fails the test by name.
"""

from __future__ import annotations

import contextlib
import re

import torch
import torch.distributed as dist

from ..verdicts import GARBAGE, IMPL_RAISED, Convention, memory_unsafe

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


def _ours(e: BaseException) -> bool:
    """An assertion of the suite (a tripwire collective reached, a check that failed), not a
    refusal by the implementation (whose exceptions, its own asserts included, are tagged)."""
    return isinstance(e, AssertionError) and not getattr(e, IMPL_RAISED, False)


class _Refused:
    """The context of :func:`refused`: the exception it caught, if any."""

    value: BaseException | None = None


@contextlib.contextmanager
def refused(words: str = r".", *, dtype_problem: bool = False):
    """The block must refuse bad input: a ValueError (or TypeError where ``dtype_problem``)
    whose message matches ``words`` (case-insensitive). How it fails says how bad it is
    (:mod:`dcp_a2a.testing.verdicts`): nothing raised is garbage accepted (a defect); a refusal of
    another type (an AssertionError of the engine's own, a RuntimeError, a Triton compile error),
    or of the right type in words that do not name the problem, is a difference of convention.
    A memory-unsafe failure and the suite's own assertions (a tripwire collective reached before
    the refusal) pass through unchanged."""
    got = _Refused()
    types = (ValueError, TypeError) if dtype_problem else (ValueError,)
    allowed = " or ".join(t.__name__ for t in types)
    try:
        yield got
    except types as e:
        got.value = e
        if not names_the_problem(str(e), words):
            raise Convention(f"refused with {type(e).__name__}, in words that do not name the "
                             f"problem ({words}): {e}") from e
        return
    except Exception as e:
        if _ours(e) or memory_unsafe(f"{type(e).__name__}: {e}"):
            raise
        raise Convention(f"refused with {type(e).__name__} instead of a {allowed} naming the "
                         f"problem: {str(e)[:300]}") from e
    raise AssertionError(f"{GARBAGE}: no error raised (expected a {allowed} naming "
                         f"{words})")


def names_the_problem(message: str, words: str) -> bool:
    return re.search(words, message, re.IGNORECASE) is not None


def refused_instead(call, words: str) -> bool:
    """Run ``call()`` on input the contract lets an implementation either handle or refuse:
    True when it refused (a ValueError/TypeError that must match ``words``), False when it
    returned (the test then checks the result). A refusal in other words or of another type
    is a difference of convention (:class:`~dcp_a2a.testing.verdicts.Convention`)."""
    try:
        call()
    except (ValueError, TypeError) as e:
        if not names_the_problem(str(e), words):
            raise Convention(f"refused with a message that does not name the problem "
                             f"({words}): {e}") from e
        return True
    except Exception as e:
        if _ours(e) or memory_unsafe(f"{type(e).__name__}: {e}"):
            raise
        raise Convention(f"refused with {type(e).__name__} instead of a ValueError naming the "
                         f"problem: {str(e)[:300]}") from e
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
