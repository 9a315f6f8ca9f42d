"""The conformance tier's refusal vocabulary (dcp_a2a/testing/conformance/_refusals.py): it
accepts the phrasings engines use for a problem; a refusal in words that do not name it, or of
another exception type, is a difference of convention; bad input accepted is a defect; the
tripwire group fails any collective by name."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dcp_a2a.testing.conformance._refusals import (HEAD_DIM_WORDS, NOT_DIVISIBLE_WORDS,
                                                   PACK_DIM_WORDS, TripwireGroup, dtype_words,
                                                   refused, refused_instead)
from dcp_a2a.testing.verdicts import Convention, severity_of

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("words,message", [
    (NOT_DIVISIBLE_WORDS, "number of heads H=6 is not divisible by the DCP world size N=4"),
    (NOT_DIVISIBLE_WORDS, "H=6 must be a multiple of N=4"),
    (NOT_DIVISIBLE_WORDS, "6 heads cannot be split evenly over 4 ranks"),
    (HEAD_DIM_WORDS, "head dim 7 does not match out's last dim 8"),
    (HEAD_DIM_WORDS, "head_dim=7 does not match"),
    (PACK_DIM_WORDS, "lse_pack_dim=1 does not match float16 (expected 2)"),
    (dtype_words(torch.float8_e4m3fn), "fp8 outputs have no wire format"),
    (dtype_words(torch.float64), "double-precision outputs are not supported"),
    (dtype_words(torch.int8), "unsupported output dtype torch.int8"),
])
def test_accepted_phrasings(words, message):
    with refused(words, dtype_problem=True):
        raise ValueError(message)


@pytest.mark.parametrize("words,message", [
    (NOT_DIVISIBLE_WORDS, "bad input"),
    (HEAD_DIM_WORDS, "shape mismatch"),
    (dtype_words(torch.float64), "unsupported dtype"),
    (dtype_words(torch.float8_e5m2), "float16 is not supported"),
])
def test_a_message_that_does_not_name_the_problem_is_a_convention(words, message):
    with pytest.raises(Convention, match="do not name the problem"):
        with refused(words, dtype_problem=True):
            raise ValueError(message)


def test_type_error_only_for_dtypes():
    with pytest.raises(Convention, match="refused with TypeError instead of a ValueError"):
        with refused(NOT_DIVISIBLE_WORDS):
            raise TypeError("H must be divisible by N")
    with refused(dtype_words(torch.float64), dtype_problem=True):
        raise TypeError("float64 is not a supported output dtype")


def test_accepted_bad_input_is_a_defect_and_another_exception_a_convention():
    with pytest.raises(AssertionError, match="bad input accepted") as e:
        with refused(NOT_DIVISIBLE_WORDS):
            pass
    assert severity_of(e.value)[0] == "defect"
    with pytest.raises(Convention, match="refused with RuntimeError") as e:
        with refused(NOT_DIVISIBLE_WORDS):
            raise RuntimeError("triton: arange's range must be a power of 2")
    assert severity_of(e.value)[0] == "convention"
    with pytest.raises(AssertionError, match="tripwire"):  # the suite's own: passes through
        with refused(NOT_DIVISIBLE_WORDS):
            raise AssertionError("tripwire: all_to_all_single reached the process group")
    assert refused_instead(lambda: None, "x") is False
    with pytest.raises(Convention):
        refused_instead(lambda: (_ for _ in ()).throw(IndexError("boom")), "x")


def test_tripwire_group_fails_every_collective_by_name():
    pg = TripwireGroup(4, 1)
    assert (pg.size(), pg.rank(), isinstance(pg, dist.ProcessGroup)) == (4, 1, True)
    x = torch.zeros(8)
    # torch.distributed reaches the group as all_to_all_single (torch 2.13) or alltoall_base
    # (torch 2.11): the tripwire names whichever method torch called
    with pytest.raises(AssertionError,
                       match="(all_to_all_single|alltoall_base) reached the process group"):
        dist.all_to_all_single(torch.empty_like(x), x, group=pg)
    with pytest.raises(AssertionError, match="allgather reached"):
        dist.all_gather([torch.empty_like(x) for _ in range(4)], x, group=pg)
    with pytest.raises(AssertionError, match="allreduce reached"):
        dist.all_reduce(x, group=pg)
