"""The engine-design baseline of the unpack-combine: a kernel written to the design of
the one vLLM main ships (``_dcp_a2a_unpack_combine_kernel``), our own code, so that the benchmark
can time ours next to the design engines run and a regression against it shows.

The design, as the issue describes it:

* grid (B, H/N): one program per token and local head;
* the whole head dim in one tile (``tl.arange`` over D, unmasked; the engine asks D to be a
  power of two: here a head dim that is not is padded to the next power of two and masked, the
  only departure, so that the baseline covers every shape ours does);
* Triton's default ``num_warps`` and compile options (multiply-add contraction allowed);
* the N ranks in a static loop, three passes over their N LSE words: the max, the sum of
  exp(lse - max), then each rank's weight exp(lse - g) (g = max + log(sum)) and the D-lane fp32
  accumulation;
* the output stored straight to ``out`` in its dtype (a plain cast; Triton's CPU interpreter
  truncates fp32 -> bf16 there, the compiled kernel rounds), the merged LSE when asked.

The contract's edge cases are kept, as selects that cost no memory traffic: NaN and +inf LSEs
count as -inf, a -inf LSE weighs exactly 0 (exp(-inf - g); where every rank is -inf, g is -inf
and the NaN weight is selected to 0), a partial whose weight is 0 is read as 0 (a NaN partial
stays out: a select a lane, as the engine's kernel has), a row where every rank is -inf merges
to 0 and -inf.

Compiled for sm_90, its PTX is the engine kernel's instruction for instruction where D is a
power of two (``docs/perf_data/engine_ptx_diff.py`` compares them, given vLLM's ``dcp.py``):
the addresses, the LSE decode and the selects are written in the order the engine's are, since
a program here moves a few hundred bytes and a few instructions more are a measurable share of
its time.

It is a baseline, not a product path: no argument checks, no masks, no determinism guarantee
across launch configurations (ours has those).

    unpack_combine(recv[N, B, H/N, D+P], head_dim, return_lse=False, is_lse_base_on_e=True)
        -> out[B, H/N, D] (recv's dtype), or (out, lse[B, H/N] float32)
"""

from __future__ import annotations

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before the kernels are defined)

import torch
import triton
import triton.language as tl


@triton.jit
def _bits32(lane):
    """A 16-bit wire lane's bits, zero-extended to 32."""
    return lane.to(tl.uint16, bitcast=True).to(tl.uint32)


@triton.jit
def _lse_of(recv_ptr, base, s_rd, D: tl.constexpr, P: tl.constexpr):
    """The fp32 LSE in the P trailing lanes of the wire row at ``base`` (NaN and +inf read as
    -inf)."""
    if P == 1:
        s = tl.load(recv_ptr + base + D * s_rd).to(tl.float32)
    else:  # two 16-bit lanes, the float32's bytes in memory order
        lo = tl.load(recv_ptr + base + D * s_rd)
        hi = tl.load(recv_ptr + base + (D + 1) * s_rd)
        s = (_bits32(lo) | (_bits32(hi) << 16)).to(tl.float32, bitcast=True)
    return tl.where((s != s) | (s == float("inf")), float("-inf"), s)


@triton.jit
def _unpack_combine_kernel(
    recv_ptr, out_ptr, lse_out_ptr,
    s_rn, s_rb, s_rh, s_rd, s_ob, s_oh, s_od, s_lb, s_lh,
    N: tl.constexpr, D: tl.constexpr, P: tl.constexpr, BLOCK_D: tl.constexpr,
    BASE_E: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    # pass 1: the max of the N LSEs
    m = float("-inf")
    for r in tl.static_range(N):
        m = tl.maximum(m, _lse_of(recv_ptr, r * s_rn + b * s_rb + h * s_rh, s_rd, D, P))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    # pass 2: their sum, shifted by the max
    total = 0.0
    for r in tl.static_range(N):
        x = _lse_of(recv_ptr, r * s_rn + b * s_rb + h * s_rh, s_rd, D, P) - m_safe
        if BASE_E:
            total += tl.exp(x)
        else:
            total += tl.exp2(x)
    if BASE_E:
        g = tl.log(total) + m_safe
    else:
        g = tl.log2(total) + m_safe
    # pass 3: each rank's weight and its D lanes
    md = d < D  # used only where D is not a power of two: the engine's loads carry no mask
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for r in tl.static_range(N):
        base = r * s_rn + b * s_rb + h * s_rh
        s = _lse_of(recv_ptr, base, s_rd, D, P)
        if BASE_E:
            w = tl.exp(s - g)
        else:
            w = tl.exp2(s - g)
        # exp(-inf - g) is 0 for a finite g; a row of -inf only (g = -inf) gives NaN: 0 too
        w = tl.where(w != w, 0.0, w)
        if BLOCK_D == D:
            x = tl.load(recv_ptr + base + d * s_rd).to(tl.float32)
        else:
            x = tl.load(recv_ptr + base + d * s_rd, mask=md, other=0.0).to(tl.float32)
        # a zero weight keeps a NaN partial out (0 * NaN is NaN): a select a lane, as the
        # engine's kernel has
        acc += tl.where(w == 0.0, 0.0, x) * w
    if BLOCK_D == D:
        tl.store(out_ptr + b * s_ob + h * s_oh + d * s_od, acc.to(out_ptr.dtype.element_ty))
    else:
        tl.store(out_ptr + b * s_ob + h * s_oh + d * s_od, acc.to(out_ptr.dtype.element_ty),
                 mask=md)
    if RETURN_LSE:
        tl.store(lse_out_ptr + b * s_lb + h * s_lh, g)


def unpack_combine(recv, head_dim, return_lse=False, is_lse_base_on_e=True, out=None,
                   lse=None):
    """The engine's wrapper: allocate (``out`` / ``lse`` given: written there instead, for the
    tests' poisoned buffers), grid (B, H/N), launch."""
    N, B, hpr, lanes = recv.shape
    if out is None:
        out = torch.empty((B, hpr, head_dim), dtype=recv.dtype, device=recv.device)
    if lse is None:
        lse = (torch.empty((B, hpr), dtype=torch.float32, device=recv.device) if return_lse
               else out)  # never written without return_lse
    if B and hpr:
        _unpack_combine_kernel[(B, hpr)](
            recv, out, lse, *recv.stride(), *out.stride(), lse.stride(0), lse.stride(1),
            N=N, D=head_dim, P=lanes - head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
            BASE_E=is_lse_base_on_e, RETURN_LSE=return_lse)
    return (out, lse) if return_lse else out
