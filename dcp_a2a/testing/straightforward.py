"""The straightforward design of the two kernels, as an engine writes them first: one program per
(token, head), the whole head row in one tile, a run-time loop over the N ranks (two passes over
their LSEs: the max, then the weights and the accumulation), default warps, fp32 accumulation,
cast on store. The benchmark times it next to ours at every shape (``python -m
dcp_a2a.testing.bench --grid``): the ratio target's baseline. It is a baseline, not a product path
(no argument checks, no masks).

It is not the design vLLM main ships for the unpack-combine (N a compile-time constant and the
rank loops unrolled, three passes over the LSEs, the merged LSE stored when asked): that one is
:mod:`dcp_a2a.testing.engine_design`, timed in the same grid.

    pack(out[B, H, D], lse[B, H] fp32, send[N, B, H/N, D+P])       send in out's dtype
    unpack_combine(recv[N, B, H/N, D+P], D) -> out[B, H/N, D]      recv's dtype
"""

from __future__ import annotations

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before the kernels are defined)

import torch
import triton
import triton.language as tl


@triton.jit
def _pack_kernel(out_ptr, lse_ptr, send_ptr, send_bits_ptr, B, H, HPR, D,
                 P: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    row = (((h // HPR) * B + b) * HPR + h % HPR) * (D + P)
    x = tl.load(out_ptr + (b * H + h) * D + d, mask=d < D)
    tl.store(send_ptr + row + d, x, mask=d < D)
    bits = tl.load(lse_ptr + b * H + h).to(tl.int32, bitcast=True)
    if P == 1:
        tl.store(send_bits_ptr + row + D, bits)
    else:
        tl.store(send_bits_ptr + row + D, (bits & 0xFFFF).to(tl.int16))
        tl.store(send_bits_ptr + row + D + 1, (bits >> 16).to(tl.int16))


@triton.jit
def _load_lse(recv_bits_ptr, row, D, P: tl.constexpr):
    if P == 1:
        s = tl.load(recv_bits_ptr + row + D).to(tl.float32, bitcast=True)
    else:
        lo = tl.load(recv_bits_ptr + row + D).to(tl.int32) & 0xFFFF
        hi = tl.load(recv_bits_ptr + row + D + 1).to(tl.int32)
        s = ((hi << 16) | lo).to(tl.float32, bitcast=True)
    return s


@triton.jit
def _unpack_kernel(recv_ptr, recv_bits_ptr, out_ptr, N, B, HPR, D,
                   P: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    m = float("-inf")
    for r in range(N):
        m = tl.maximum(m, _load_lse(recv_bits_ptr, ((r * B + b) * HPR + h) * (D + P), D, P))
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    total = 0.0
    for r in range(N):
        row = ((r * B + b) * HPR + h) * (D + P)
        w = tl.exp(_load_lse(recv_bits_ptr, row, D, P) - m)
        total += w
        acc += w * tl.load(recv_ptr + row + d, mask=d < D, other=0.0).to(tl.float32)
    y = acc / total
    tl.store(out_ptr + (b * HPR + h) * D + d, y.to(out_ptr.dtype.element_ty), mask=d < D)


_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


def pack(out, lse, send) -> None:
    B, H, D = out.shape
    N, _, hpr, lanes = send.shape
    _pack_kernel[(B, H)](out, lse, send, send.view(_BITS[send.dtype]), B, H, hpr, D,
                         P=lanes - D, BLOCK_D=triton.next_power_of_2(D))


def unpack_combine(recv, head_dim):
    N, B, hpr, lanes = recv.shape
    out = torch.empty((B, hpr, head_dim), dtype=recv.dtype, device=recv.device)
    _unpack_kernel[(B, hpr)](recv, recv.view(_BITS[recv.dtype]), out, N, B, hpr, head_dim,
                             P=lanes - head_dim, BLOCK_D=triton.next_power_of_2(head_dim))
    return out
