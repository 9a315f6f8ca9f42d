"""How fast can any kernel move the pack's bytes? At the grid's
512-lane heads (fp32 D=512) of 4k rows and more, the straightforward pack and ours next to a
device copy of the same bytes (``copy_``: the driver's device-to-device memcpy) and a sweep of
plain Triton copies of them (16-byte words; elements per program x warps, and a persistent
grid-stride variant): the fastest copy found is the floor no pack reaches, since a pack moves
the same bytes and a copy is the simplest way to move them. Rounds interleave every variant;
each copy's bytes are checked against its source, and the packs' against the straightforward
kernel's, first.

    python benchmarks/benchmark_copy_bandwidth.py OUT.json [--budget SECONDS]   (on a GPU)
"""
import statistics, time
import torch
import triton
import triton.language as tl
from dcp_a2a.testing.bench import copy_bandwidth, timed_rounds
from _rounds import check_bytes, copy_pair, fp32_d512_points, point_runs, packs
import _run


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


@triton.jit
def _copy_persistent_kernel(src, dst, n, BLOCK: tl.constexpr):
    # grid-stride: each program walks blocks P apart, so programs stay resident
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    for _ in range(tl.cdiv(n, step)):
        m = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)
        offs += step


def triton_copy(src, dst, block, warps, persistent=None):
    n = src.numel()
    if persistent:
        grid = (min(persistent, triton.cdiv(n, block)),)
        return lambda: _copy_persistent_kernel[grid](src, dst, n, BLOCK=block, num_warps=warps)
    grid = (triton.cdiv(n, block),)
    return lambda: _copy_kernel[grid](src, dst, n, BLOCK=block, num_warps=warps)


def parser():
    ap = _run.parser(__doc__, "benchmark_copy_bandwidth.py")
    _run.add_out(ap)
    ap.add_argument("--budget", type=_run.positive_float, default=300.0,
                    help="seconds of points (the rest are skipped)")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    with _run.recorded(args.out, "copy_bandwidth") as save:
        measure(save, args.budget)


def measure(save, budget):
    t0 = time.time()
    copy = copy_bandwidth(1 << 30)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (elements a program, warps, persistent programs); every thread holds a 16-byte word or more
    COPIES = [(1024, 4, None), (2048, 4, None), (2048, 8, None), (4096, 4, None), (4096, 8, None),
              (4096, 16, None), (8192, 8, None), (8192, 16, None), (4096, 8, 4 * sms),
              (4096, 8, 8 * sms)]
    pts = fp32_d512_points(4096)
    rows = []
    for (b, h, n, d, dt), (p, hpr, out, lse, send, nbytes, ref) in point_runs(pts, t0, budget):
        variants = packs(out, lse, send, hpr)
        check_bytes(variants, send, ref, (b, h, n, d, dt))
        # as int32 words: 16-byte accesses when a thread holds 4 of them
        c_src, c_dst = copy_pair(nbytes)
        copies = {"copy_": lambda: c_dst.copy_(c_src)}
        copies.update({f"tl{blk}x{w}" + (f"_p{pers // sms}" if pers else ""):
                       triton_copy(c_src, c_dst, blk, w, pers) for blk, w, pers in COPIES})
        check_bytes(copies, c_dst, c_src.view(torch.uint8), (b, h, n, d, dt))
        variants.update(copies)
        us, times, _ = timed_rounds(variants, nbytes)
        best = min(copies, key=us.get)
        r = dict(B=b, H=h, N=n, D=d, dtype=dt, us=us, rounds=times, best_copy=best,
                 best_copy_over_sf=us[best] / us["sf"], table_over_sf=us["table"] / us["sf"],
                 best_copy_over_copy_=us[best] / us["copy_"], table_over_best_copy=us["table"] / us[best])
        rows.append(r)
        print(f"{b} {h} {n} rows {b * h}: sf {us['sf']:.2f} table {us['table']:.2f} copy_ "
              f"{us['copy_']:.2f} best {best} {us[best]:.2f} | best/sf {r['best_copy_over_sf']:.3f} "
              f"table/sf {r['table_over_sf']:.3f} best/copy_ {r['best_copy_over_copy_']:.3f} "
              f"table/best {r['table_over_best_copy']:.3f}", flush=True)
        save(dict(device=torch.cuda.get_device_name(), copy_gbps=copy, rows=rows))
    for k in ("best_copy_over_sf", "table_over_sf", "best_copy_over_copy_", "table_over_best_copy"):
        rs = [r[k] for r in rows]
        print(f"{k}: min {min(rs):.3f} median {statistics.median(rs):.3f} max {max(rs):.3f}")
    print(f"best copy >= 0.95 x sf at {sum(r['best_copy_over_sf'] >= 0.95 for r in rows)} of "
          f"{len(rows)} points; {len(rows)} of {len(pts)} points in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
