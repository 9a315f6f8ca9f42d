"""The values of the mask's index tensors: on the host (CPU tensors) a negative KV length, a
decreasing query_start_loc, one that starts below 0 or ends past the batch are a ValueError
before any launch, on every call (values are not part of a kept key) and on every backend; on
the device the kernels give every value its documented meaning (a seq_len <= 0 is an empty
shard, rows past query_start_loc[-1] are padding)."""

from __future__ import annotations

import math

import pytest
import torch

import dcp_a2a
from dcp_a2a import Group, _env, ops
from dcp_a2a.inprocess import lse_reduce_in_process
from dcp_a2a.testing.data import partials

pytestmark = pytest.mark.unit

B, H, D = 3, 2, 8

# Index tensors live with the attention output, and their values are read on the host only
# where that is the CPU: CPU tensors, which the kernels take only through Triton's interpreter
# (off on a machine with CUDA, where the kernels give every value a meaning instead: the last
# test, on the device).
host_values = pytest.mark.skipif(
    not _env.INTERPRET, reason="host checks of CPU index tensors: CPU tensors run the kernels "
                               "only through Triton's interpreter, off on this CUDA machine "
                               "(the CPU tier runs these)")


def _pack_args():
    outs, lses = partials(1, B, H, D, torch.float16)
    return (outs[0], lses[0], torch.empty(1, B, H, D + 2, dtype=torch.float16), 1, H, D, 2)


def _t(values):
    return torch.tensor(values, dtype=torch.int32)


BAD = {  # (seq_lens, query_start_loc, what the message names)
    "negative_kv_length": ([-1, 1, 1], [0, 1, 2, 3], r"seq_lens\[0\] = -1.*>= 0"),
    "negative_kv_length_5": ([1, -5, 1], [0, 1, 2, 3], r"seq_lens\[1\] = -5"),
    "past_the_batch": ([1, 1, 1], [0, 1, 2, 99], r"query_start_loc\[-1\] = 99 is past the batch"),
    "decreasing": ([1, 1, 1], [0, 2, 1, 3], r"non-decreasing.*2 then 1"),
    "starts_below_zero": ([1, 1, 1], [-1, 1, 2, 3], r"query_start_loc\[0\] = -1"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_pack_send_refuses_bad_index_values_on_the_host(case):
    sl, qsl, words = BAD[case]
    with pytest.raises(ValueError, match=words):
        dcp_a2a.pack_send(*_pack_args(), seq_lens=_t(sl), query_start_loc=_t(qsl))


@host_values
@pytest.mark.parametrize("case", list(BAD))
def test_refused_after_a_kept_call_of_the_same_shapes(case):
    """The values are read on every call: a good call's kept key (same shapes, dtypes,
    alignment) does not let bad values through."""
    ops.forget_calls()
    args = _pack_args()
    good = dict(seq_lens=_t([1, 0, 1]), query_start_loc=_t([0, 1, 2, 3]))
    dcp_a2a.pack_send(*args, **good)
    dcp_a2a.pack_send(*args, **good)
    assert ops._PACK_CALLS
    sl, qsl, words = BAD[case]
    good["seq_lens"].copy_(_t(sl))
    good["query_start_loc"].copy_(_t(qsl))
    with pytest.raises(ValueError, match=words):
        dcp_a2a.pack_send(*args, **good)


@host_values
@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs", "symm_mem"])
@pytest.mark.parametrize("case", ["negative_kv_length", "past_the_batch"])
def test_lse_reduce_refuses_bad_index_values_on_every_backend(backend, case):
    sl, qsl, words = BAD[case]
    outs, lses = partials(2, B, H, D, torch.float32)
    with pytest.raises(ValueError, match=words):
        lse_reduce_in_process(list(outs), list(lses), backend=backend,
                              seq_lens=[_t(sl), _t([1, 1, 1])], query_start_loc=_t(qsl))
    with pytest.raises(ValueError, match=words):  # a group of one: no exchange, same check
        dcp_a2a.lse_reduce(outs[0], lses[0], Group(1, 0, None), backend=backend,
                           seq_lens=_t(sl), query_start_loc=_t(qsl),
                           **({"buffers": dcp_a2a.SymmMemBuffers.in_process(
                               1, max_tokens=B, num_heads=H, head_dim=D,
                               dtype=torch.float32, device="cpu")[0]}
                              if backend == "symm_mem" else {}))


@host_values
def test_edge_values_that_mean_something_are_accepted():
    """0 (an empty shard), query_start_loc ending before B (padding), starting above 0 (rows
    before it are padding), repeated entries (requests without query rows), no request."""
    args = _pack_args()
    for sl, qsl in (([0, 0, 0], [0, 1, 2, 3]), ([2, 1], [0, 1, 2]), ([1], [1, 3]),
                    ([1, 1, 1], [0, 1, 1, 3]), ([], [0])):
        dcp_a2a.pack_send(*args, seq_lens=_t(sl), query_start_loc=_t(qsl))


def test_the_kernel_takes_a_negative_kv_length_as_an_empty_shard(device):
    """What a CUDA index tensor with the same values means (no host check there): the pack
    kernel masks the rows of a request whose seq_len is <= 0 (through the kernel's launcher,
    which the public op guards on the CPU)."""
    from dcp_a2a.kernels.pack import pack

    out, lse, send, *_ = (a.to(device) if torch.is_tensor(a) else a for a in _pack_args())
    send.fill_(float("nan"))
    pack(out, lse, send, H, seq_lens=_t([-5, 2, 0]).to(device),
         query_start_loc=_t([0, 1, 2, 3]).to(device))
    sent = send[0, :, :, D:].contiguous().view(torch.float32)[..., 0]
    assert torch.all(sent[0] == -math.inf) and torch.all(sent[2] == -math.inf)
    assert torch.equal(sent[1], lse[1])
