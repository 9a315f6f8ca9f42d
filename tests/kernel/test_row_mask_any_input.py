"""query_start_loc must be non-decreasing, from >= 0 to at most B, and seq_lens >= 0: CPU index
tensors are checked on the host (ValueError); CUDA ones are not (a check would cost a host sync
on the decode path), and there any values have the meaning the pack kernel and the reference
share: the same binary search, so they mask the same rows. And index tensors with strides are
read through them, by every backend."""

from __future__ import annotations

import math

import pytest
import torch

import dcp_a2a
from dcp_a2a.reference import wire

pytestmark = pytest.mark.kernel


@pytest.mark.parametrize("seed", range(4))
def test_kernel_and_reference_mask_the_same_rows_on_any_query_start_loc(device, seed):
    g = torch.Generator().manual_seed(seed)
    b, h, d, n_seqs = 9, 2, 8, 5
    qsl = torch.randint(-2, b + 3, (n_seqs + 1,), generator=g, dtype=torch.int32)
    if seed == 0:
        qsl = torch.tensor([0, 5, 1, 7, 3, 9], dtype=torch.int32)  # the kind of input
    seq_lens = torch.randint(0, 3, (n_seqs,), generator=g, dtype=torch.int32)
    out = torch.randn(b, h, d, generator=g).to(torch.float16)
    lse = torch.randn(b, h, generator=g)
    send = torch.empty(1, b, h, d + 2, dtype=torch.float16, device=device)
    args = (out.to(device), lse.to(device), send, 1, h, d, 2)
    mask = dict(seq_lens=seq_lens.to(device), query_start_loc=qsl.to(device))
    if device.type == "cpu":  # refused on the host; the kernel alone gives them a meaning
        with pytest.raises(ValueError, match="query_start_loc"):
            dcp_a2a.pack_send(*args, **mask)
        from dcp_a2a.kernels.pack import pack

        pack(args[0], args[1], send, h, **mask)
    else:
        dcp_a2a.pack_send(*args, **mask)
    sent = send.cpu()[0, :, :, d:].contiguous().view(torch.float32)[..., 0]  # [B, H] fp32
    masked = wire.row_mask(b, seq_lens, qsl)
    assert torch.equal(torch.isinf(sent).all(dim=1) & (sent < 0).all(dim=1), masked), (qsl, seq_lens)
    assert torch.equal(sent[~masked], lse[~masked])
    assert bool((sent[masked] == -math.inf).all())


@pytest.mark.parametrize("backend", ["packed", "two_collective", "ag_rs"])
def test_every_backend_reads_index_tensors_through_their_strides(device, backend):
    """Each rank's seq_lens a column of one [requests, N] table and query_start_loc every other
    entry of a longer tensor (views with strides): every backend's lse_reduce gives the bits it
    gives for contiguous copies. The pack, the LSE-to-wire step of two_collective and ag_rs, and
    a second call of each (kept launches) read them; ag_rs once read them as if contiguous."""
    from dcp_a2a.inprocess import lse_reduce_in_process

    g = torch.Generator().manual_seed(3)
    n, b, h, d = 3, 7, 6, 8
    qsl = torch.tensor([0, 2, 3, 3, 6], dtype=torch.int32)  # row 6: padding
    table = torch.randint(0, 3, (4, n + 1), generator=g, dtype=torch.int32)
    table[1, :n] = torch.tensor([0, 2, 0], dtype=torch.int32)
    outs = [torch.randn(b, h, d, generator=g).to(device) for _ in range(n)]
    lses = [(torch.randn(b, h, generator=g) * 3).to(device) for _ in range(n)]
    spread = torch.stack([qsl, torch.full_like(qsl, 99)], dim=1).reshape(-1).to(device)
    strided = dict(seq_lens=[table.to(device)[:, r] for r in range(n)],
                   query_start_loc=spread[::2])
    assert not strided["seq_lens"][0].is_contiguous()
    assert not strided["query_start_loc"].is_contiguous()
    plain = dict(seq_lens=[s.contiguous() for s in strided["seq_lens"]],
                 query_start_loc=strided["query_start_loc"].contiguous())
    want = lse_reduce_in_process(outs, lses, return_lse=True, backend=backend, **plain)
    for _ in range(2):
        got = lse_reduce_in_process(outs, lses, return_lse=True, backend=backend, **strided)
        for (o, s), (wo, ws) in zip(got, want):
            assert torch.equal(o.view(torch.int32), wo.view(torch.int32))
            assert torch.equal(s.view(torch.int32), ws.view(torch.int32))
