"""What parts our unpack-combine from the engine-design baseline at fp32 D=512, N=8, where the
bytes fit the L2 (on an H100 ours takes about 1.3 x the engine design at 2048 rows there, and no
launch of ours comes within 1.29: docs/perf_history.md).

    python benchmarks/benchmark_combine_engine_bisect.py [OUT.json] [--rounds 7]
    python benchmarks/benchmark_combine_engine_bisect.py --smoke   (tiny shapes, any device:
        structure only)

Bisects between the two kernels at the same launch (one token and head a program, the whole
head in one tile). The engine design's kernel is copied here with switches that each move it
one step towards ours:

* ``rt_d``: the head dim a run-time argument (ours), its tile masked by ``d < D``, instead of
  a constexpr (the mask folded away, and the LSE lane's offset a constant);
* ``i32``: 32-bit offsets (ours, below 2^31) instead of 64-bit ones;
* ``hoist``: all N ranks' tiles loaded before the weights are computed (ours) instead of each
  rank's load beside its weight;
* ``nofma``: multiply-add contraction off (ours);
* ``two_d``: the tile a [1, BLOCK_D] block (ours: [rows, BLOCK_D]) instead of a vector;
* ``w2`` / ``w8``: 2 or 8 warps instead of Triton's default 4;

and ours is timed at its table's launch and at one head a program with 1, 2, 4 and 8 warps.
The registers and spills of every kernel compiled are printed and kept (Triton's caches).

Tried beside it (docs/perf_history.md): ours with each rank's tile loaded where it is added
(ptxas hoisted the loads anyway, the same SASS) and with a thread's registers capped (maxnreg
128/64/48/32 at 1/2/2/4 warps, where every program of 2048 rows would fit the SMs at once:
spills, 2-3 x the engine design). The same interleaved rounds of CUDA-graph replays as the
grid (``bench.timed_rounds``); every
variant's output is checked against ours within 2^-6 first. Prints the median per-round ratio
of each variant over the engine design per point; the JSON keeps every round.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, uninstalled
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside it

import dcp_a2a  # noqa: E402  (first: it picks Triton's interpreter on a machine without CUDA)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dcp_a2a.kernels import tuning  # noqa: E402
from dcp_a2a.testing import bench, engine_design  # noqa: E402
from benchmark_decode_vs_engine_design import wall_timer, wire, with_launch  # noqa: E402

import _run  # noqa: E402

POINTS = [  # (B, H, D, N, dtype): the missed rows, either side of them, and a bf16 control
    (256, 64, 512, 8, "float32"), (128, 128, 512, 8, "float32"),
    (64, 64, 512, 8, "float32"), (1024, 128, 512, 8, "float32"),
    (256, 64, 512, 8, "bfloat16"), (512, 64, 512, 8, "float32"), (512, 16, 512, 4, "float32"),
    (128, 128, 512, 8, "bfloat16"), (256, 16, 512, 2, "bfloat16"), (32, 16, 80, 2, "bfloat16"),
]
SMOKE_POINTS = [(2, 8, 24, 4, "float32"), (2, 8, 24, 4, "bfloat16")]


@triton.jit
def _engine_variant(recv_ptr, out_ptr, s_rn, s_rb, s_rh, s_ob, s_oh, D_rt,
                    N: tl.constexpr, D: tl.constexpr, P: tl.constexpr, BLOCK_D: tl.constexpr,
                    RT_D: tl.constexpr, I32: tl.constexpr, HOIST: tl.constexpr,
                    TWO_D: tl.constexpr):
    """The engine design's combine (base e, no LSE out) with the switches above."""
    if I32:
        b = tl.program_id(0)
        h = tl.program_id(1)
    else:
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
    row = b * s_rb + h * s_rh
    if TWO_D:
        d = tl.arange(0, BLOCK_D)[None, :]
    else:
        d = tl.arange(0, BLOCK_D)
    if RT_D:
        lse_lane = D_rt
        md = d < D_rt
    else:
        lse_lane = D
        md = d < D
    lses = ()
    for r in tl.static_range(N):
        if P == 1:
            s = tl.load(recv_ptr + r * s_rn + row + lse_lane).to(tl.float32)
        else:
            lo = tl.load(recv_ptr + r * s_rn + row + lse_lane).to(tl.int16, bitcast=True)
            hi = tl.load(recv_ptr + r * s_rn + row + lse_lane + 1).to(tl.int16, bitcast=True)
            s = ((hi.to(tl.int32) << 16) | (lo.to(tl.int32) & 0xFFFF)).to(tl.float32,
                                                                          bitcast=True)
        lses = lses + (tl.where((s != s) | (s == float("inf")), float("-inf"), s),)
    tiles = ()
    if HOIST:
        for r in tl.static_range(N):
            tiles = tiles + (tl.load(recv_ptr + r * s_rn + row + d, mask=md, other=0.0),)
    m = float("-inf")
    for r in tl.static_range(N):
        m = tl.maximum(m, lses[r])
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = 0.0
    for r in tl.static_range(N):
        total += tl.exp(lses[r] - m_safe)
    g = m_safe + tl.log(total)
    if TWO_D:
        acc = tl.zeros((1, BLOCK_D), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for r in tl.static_range(N):
        w = tl.exp(lses[r] - g)
        w = tl.where(lses[r] == float("-inf"), 0.0, w)
        if HOIST:
            x = tiles[r]
        else:
            x = tl.load(recv_ptr + r * s_rn + row + d, mask=md, other=0.0)
        acc += w * tl.where(w == 0.0, 0.0, x.to(tl.float32))
    tl.store(out_ptr + b * s_ob + h * s_oh + d, acc.to(out_ptr.dtype.element_ty), mask=md)


def engine_variant(recv, head_dim, rt_d=False, i32=False, hoist=False, nofma=False,
                   warps=4, two_d=False):
    n, b, hpr, lanes = recv.shape
    out = torch.empty((b, hpr, head_dim), dtype=recv.dtype, device=recv.device)
    opts = {"num_warps": warps}
    if nofma:
        opts["enable_fp_fusion"] = False
    _engine_variant[(b, hpr)](
        recv, out, recv.stride(0), recv.stride(1), recv.stride(2), out.stride(0),
        out.stride(1), head_dim, N=n, D=head_dim, P=lanes - head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), RT_D=rt_d, I32=i32, HOIST=hoist,
        TWO_D=two_d, **opts)
    return out


ENGINE_VARIANTS = {
    "eng_copy": {}, "rt_d": {"rt_d": True}, "i32": {"i32": True}, "hoist": {"hoist": True},
    "nofma": {"nofma": True}, "two_d": {"two_d": True}, "w2": {"warps": 2}, "w8": {"warps": 8},
    "all_five": {"rt_d": True, "i32": True, "hoist": True, "nofma": True, "two_d": True},
}
for _k in ("rt_d", "i32", "hoist", "nofma", "two_d"):  # all five but one
    ENGINE_VARIANTS[f"no_{_k}"] = {k: v for k, v in ENGINE_VARIANTS["all_five"].items()
                                   if k != _k}


def variants_at(point, device):
    b, h, d, n, dt = point
    p, recv, nbytes = wire(b, h, d, n, dt, device)
    ours = lambda: dcp_a2a.unpack_combine(recv, d, p, False, True)  # noqa: E731
    v = {"ours": ours, "engine": lambda: engine_design.unpack_combine(recv, d)}
    for name, kw in ENGINE_VARIANTS.items():
        v[name] = (lambda kw=kw: engine_variant(recv, d, **kw))
    for w in (1, 2, 4, 8):
        v[f"ours_h1_w{w}"] = with_launch(tuning.Launch(1, 1 << 30, w), ours)
    ref = ours()
    for name, fn in v.items():  # ours under any launch: the same bits; the others within 2^-6
        got = fn()
        same = (torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
                if name.startswith("ours") else
                torch.allclose(got.float(), ref.float(), rtol=2 ** -6, atol=2 ** -6))
        if not same:
            raise AssertionError(f"{name} differs from ours at {point}")
    return v, nbytes


def compiled_registers():
    """Registers and spills a thread of each kernel compiled here (Triton's own caches)."""
    from dcp_a2a.kernels import combine
    found = []
    for kern in (combine.combine_rows, _engine_variant, engine_design._unpack_combine_kernel):
        for cache in getattr(kern, "device_caches", {}).values():
            for key, ck in cache[0].items():
                md = ck.metadata
                found.append({"kernel": kern.fn.__name__, "n_regs": ck.n_regs,
                              "n_spills": ck.n_spills, "num_warps": md.num_warps,
                              "key": str(key)[:300]})
    return found


def main(argv=None):
    ap = _run.parser(__doc__, "benchmark_combine_engine_bisect.py")
    _run.add_out(ap, required=False)
    ap.add_argument("--rounds", type=_run.positive_int, default=7)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    with _run.recorded(a.out, "combine_engine_bisect") as save:
        return bisect(a, save)


def bisect(a, save):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    points = SMOKE_POINTS if a.smoke else POINTS
    timer = None if device == "cuda" else wall_timer
    rounds = 2 if a.smoke else a.rounds
    t0, rows = time.time(), []
    for point in points:
        v, nbytes = variants_at(point, device)
        med, times, method = bench.timed_rounds(v, nbytes, rounds, timer)
        ratio = {k: statistics.median(x / y for x, y in zip(times[k], times["engine"]))
                 for k in v}
        rows.append({"point": point, "bytes": nbytes, "timing": method, "median_us": med,
                     "times_us": times, "over_engine": ratio})
        print(f"B={point[0]} H={point[1]} D={point[2]} N={point[3]} {point[4]}: engine "
              f"{med['engine']:.2f} us ({nbytes / med['engine'] / 1e3:.0f} GB/s)")
        print("   " + "  ".join(f"{k} {r:.3f}" for k, r in ratio.items() if k != "engine"))
    regs = compiled_registers() if device == "cuda" else []
    for r in regs:
        print("  ", r)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    save({"device": name, "torch": torch.__version__, "triton": triton.__version__,
          "rounds": rounds, "seconds": time.time() - t0, "rows": rows, "registers": regs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
