"""query_start_loc must be non-decreasing (a precondition: checking it would cost a host sync
on the decode path). On any other input the pack kernel and the reference run the same binary
search, so they still mask the same rows."""

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
    dcp_a2a.pack_send(out.to(device), lse.to(device), send, 1, h, d, 2,
                      seq_lens=seq_lens.to(device), query_start_loc=qsl.to(device))
    sent = send.cpu()[0, :, :, d:].contiguous().view(torch.float32)[..., 0]  # [B, H] fp32
    masked = wire.row_mask(b, seq_lens, qsl)
    assert torch.equal(torch.isinf(sent).all(dim=1) & (sent < 0).all(dim=1), masked), (qsl, seq_lens)
    assert torch.equal(sent[~masked], lse[~masked])
    assert bool((sent[masked] == -math.inf).all())
