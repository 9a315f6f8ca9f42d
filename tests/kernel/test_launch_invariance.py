"""Every launch configuration the table can pick gives the same bits, and packed,
two_collective and symm_mem agree bit for bit under each of them.

The identity packed == two_collective is what the accuracy job checks across real ranks; on an
H200 it once failed for float32 at B=1 because the compiler contracted ``acc + w * x`` into an
FMA in one kernel specialisation and not in the other. This test sees that class of bug on one
device, in one process: all N ranks run in this process (``dcp_a2a.inprocess``), every backend,
under every configuration of ``dcp_a2a.kernels.tuning.every_launch``. On a GPU it runs the
accuracy job's grid compiled; on the CPU interpreter a small grid (the same code paths, numpy arithmetic).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

import pytest
import torch

import dcp_a2a
from dcp_a2a.kernels import pack, tuning
from dcp_a2a.testing.accuracy_cases import GPU_SHAPES, Shape, parse_shapes, rank_partial
from dcp_a2a.inprocess import lse_reduce_in_process
from dcp_a2a.testing.data import bits_view
from dcp_a2a.testing.gpumem import gpu_memory_share

pytestmark = pytest.mark.kernel

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
CPU_SHAPES = [Shape(2, 8, 24)]  # the interpreter: one small shape (paired 16-bit path, fp32)


def _grid():
    """(shape, dtype name) of the grid: the accuracy job's GPU shapes compiled, one small shape
    on the interpreter (the device fixture is CUDA exactly when a GPU is visible)."""
    shapes = parse_shapes(GPU_SHAPES) if torch.cuda.is_available() else CPU_SHAPES
    for shape, dt in itertools.product(shapes, DTYPES):
        if shape.dtype in (None, dt):
            yield shape, dt


def _configs(out, n):
    """Per run, an override for each kernel: the i-th configuration of each kind's list (the
    pack's includes its slab kernel where that fits the problem)."""
    b, heads, d = out.shape
    src, lanes, lanes_p, _ = pack.lanes_of(out, dcp_a2a.lse_pack_dim(out.dtype))
    slab_ok = pack.slab_fits(src, lanes, lanes_p, heads // n)
    lists = {"pack": tuning.every_launch("pack", b, heads, lanes, n, slab_ok),
             "combine": tuning.every_launch("combine", b, heads // n, lanes, n),
             "scale": tuning.every_launch("scale", b, heads, d)}
    # the combine with a head's lanes split over 2 and 4 programs (the bench's candidates; on
    # the interpreter's shape the last tile is partly masked, and 4 gives 3 programs a row)
    lists["combine"] += [tuning.Launch(1, 0, 2, split_d=s) for s in (2, 4)]
    # and on a head-major grid (the bench's candidates; programs walk a token's heads)
    lists["combine"] += [tuning.Launch(h, 1 << 30, 2, head_major=True) for h in (1, 2)]
    if out.device.type == "cpu":
        lists = {k: _interpreted(v) for k, v in lists.items()}
    runs = max(len(v) for v in lists.values())
    return [{k: v[i % len(v)] for k, v in lists.items()} for i in range(runs)]


def _interpreted(launches):
    """The launches the interpreter can tell apart. It runs a program as numpy over whole blocks:
    ``num_warps`` (a launch option, never a constexpr of ours) changes nothing it executes, so
    launches differing only there would repeat the same run (on the CPU they were 10 a kind,
    not 4, and this test's 51 s of CI time)."""
    seen, keys = [], set()
    for cfg in launches:
        key = dataclasses.replace(cfg, num_warps=1)
        if key not in keys:
            keys.add(key)
            seen.append(cfg)
    return seen


def _all_backends(outs, lses, base_e):
    return {be: lse_reduce_in_process(outs, lses, return_lse=True, is_lse_base_on_e=base_e,
                                      backend=be)
            for be in ("packed", "two_collective", "ag_rs", "symm_mem")}


def _same(a, b) -> bool:
    return a.shape == b.shape and bool(torch.equal(bits_view(a.contiguous()),
                                                   bits_view(b.contiguous())))


# the GPU's groups; the interpreter takes ~4 s a group, so one there
GROUPS = (2, 4, 8) if torch.cuda.is_available() else (2,)


def _cases():
    """(case number, N, dtype name, shape) of the whole grid; the case numbers seed the
    partials as they did when one test ran the whole grid.

    Ordered so that cases compiling the same kernels do not run at once. A case's time on a
    GPU is mostly compiling (11-30 s whatever its shape, one H100): every launch of the table
    is a specialisation of its own, per N, element width (the pack moves float16 and bfloat16
    as the same int32 words), heads per rank, head dim and B == 1 (B, H and the strides are
    otherwise runtime integers divisible by 16). xdist hands tests out in order, so two cases
    of one such class next to each other would compile the same kernels side by side: the
    k-th case of every class runs after the (k-1)-th of all of them, by when those have filled
    Triton's cache. (Not yet timed on a GPU.)"""
    cases = [(case, n, dt, shape) for case, (n, (shape, dt))
             in enumerate(itertools.product(GROUPS, _grid()), start=1)]
    seen = collections.Counter()
    ranked = []
    for c in cases:
        case, n, dt, shape = c
        key = (n, DTYPES[dt].itemsize, shape.b == 1, shape.h // n, shape.d)
        ranked.append((seen[key], case, c))  # the how-many-th of its class
        seen[key] += 1
    return [c for _, _, c in sorted(ranked, key=lambda r: r[:2])]


def _memory_need(n, dt, shape) -> int:
    """GPU bytes one case peaks at: (16 + 6 N) times one rank's partial. Measured on an H100
    for the 512 MiB bfloat16 partials of 8192x64x512: 10.7 GiB at N = 2, at most 16 GiB at
    N = 4, at most 32 GiB at N = 8. The peak holds the partials, every simulated rank's send
    and receive buffers, ag_rs's float32 weighted outputs and two backends' results held for
    the comparison. Eight workers running these cases at once without asking used up an
    80 GiB H100."""
    return (16 + 6 * n) * shape.b * shape.h * shape.d * DTYPES[dt].itemsize


# One test per (base, case): the same cases and checks as one test of the whole grid, but
# xdist spreads them, and only the one large case waits for a share of the card. As two tests
# (one per base) they were the whole of validate's wall time on one H200 (316-343 s each, cold
# Triton cache); as 18 (base x N x dtype, each holding its largest case's share throughout) the
# two N = 8 bfloat16 ones took 148 and 180 s on one H100, behind each other's 32 GiB share.
@pytest.mark.slow  # every configuration x every backend: ~7 s a dtype on the interpreter
@pytest.mark.parametrize("case,n,dt,shape", [
    pytest.param(case, n, dt, s, id=f"n{n}-{dt}-{s.b}x{s.h}x{s.d}")
    for case, n, dt, s in _cases()])
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_every_launch_gives_the_same_bits(device, base_e, case, n, dt, shape):
    with gpu_memory_share(_memory_need(n, dt, shape), device):
        _every_launch_gives_the_same_bits(device, base_e, case, n, dt, shape)


def _with_identities(parts):
    """The partials with the merge's identity in: in a fifth of the rows (a different fifth on
    each rank) a rank's LSE is -inf and its output NaN or inf, and one row is -inf on every
    rank. Every such weight is 0 and no NaN may get in, under any launch: a kernel whose
    zero-weight guard differs between launches (a select a lane in one, a branch a program in
    another) gives different bits here, where random partials alone cannot tell."""
    out = []
    for r, (o, lse) in enumerate(parts):
        o, lse = o.clone(), lse.clone()
        b = torch.arange(lse.shape[0], device=lse.device)[:, None]
        h = torch.arange(lse.shape[1], device=lse.device)[None, :]
        hole = (b + 2 * h + r) % 5 == 0
        hole[-1, -1] = True
        lse[hole] = float("-inf")
        o[hole] = torch.where(torch.arange(o.shape[-1], device=o.device) % 2 == 0,
                              float("nan"), float("inf")).to(o.dtype)
        out.append((o, lse))
    return out


def _every_launch_gives_the_same_bits(device, base_e, case, n, dt, shape):
    dtype = DTYPES[dt]
    parts = _with_identities([rank_partial(7, case, r, shape, dtype, 4.0, device)
                              for r in range(n)])
    outs, lses = [p[0] for p in parts], [p[1] for p in parts]
    first, checked = None, 0
    for cfg in _configs(outs[0], n):
        tuning.OVERRIDES.update(cfg)
        try:
            res = _all_backends(outs, lses, base_e)
        finally:
            tuning.OVERRIDES.clear()
        where = f"{shape} {dt} N={n} base {'e' if base_e else 2} under {cfg}"
        for r, be in itertools.product(range(n), ("two_collective", "symm_mem")):
            (po, pl), (to, tl_) = res["packed"][r], res[be][r]
            assert _same(po, to) and _same(pl, tl_), (
                f"packed != {be} on rank {r}: {where}; "
                f"{int((bits_view(po) != bits_view(to)).sum())} output elements differ, "
                f"max |diff| {float((po.float() - to.float()).abs().max()):.3e}")
        if first is None:
            first = (cfg, res)
            continue
        for be, r in itertools.product(res, range(n)):
            for a, b, what in zip(res[be][r], first[1][be][r], ("output", "lse")):
                assert _same(a, b), (f"{be} {what} on rank {r} changed with the launch: "
                                     f"{where} vs {first[0]}")
        checked += 1
    assert checked > 0  # at least two configurations were compared
