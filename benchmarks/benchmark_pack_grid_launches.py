"""Pack launch sweep over the comparison grid: at every point, heads a program x warps
(tuning.OVERRIDES), next to the straightforward kernel and the table.

    python benchmarks/benchmark_pack_grid_launches.py OUT.json [--budget SECONDS]   (on a GPU)
"""
import time

import _run


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_grid_launches.py")
    _run.add_out(ap)
    ap.add_argument("--budget", type=_run.positive_float, default=300.0,
                    help="seconds of points (the rest are skipped)")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    with _run.recorded(args.out, "pack_grid_launches") as save:
        measure(save, args.budget)


def measure(save, budget):
    import torch
    from dcp_a2a.kernels import tuning
    from dcp_a2a.kernels._host import next_pow2, prev_pow2
    from dcp_a2a.kernels.pack import lanes_of
    from dcp_a2a.ops import pack_send
    from dcp_a2a.testing import straightforward as sf
    from dcp_a2a.testing.bench import _inputs, copy_bandwidth, grid_points, time_us

    t0 = time.time()
    copy = copy_bandwidth(1 << 30)
    pts = list(grid_points())
    rows_of = lambda p: p[0] * p[1]
    order = ([p for p in pts if 1024 < rows_of(p) <= 65536]
             + [p for p in pts if rows_of(p) <= 1024] + [p for p in pts if rows_of(p) > 65536])
    res = []
    for (b, h, n, d, dt) in order:
        if time.time() - t0 > budget:
            break
        dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dt)
        nbytes = b * h * d * es + b * h * 4 + send.numel() * es
        lanes = lanes_of(out, p)[1]  # as the pack moves them: 32-bit words where paired
        bd = min(next_pow2(lanes), 1024)
        rows = b * h
        Ls = (256, 512, 1024) if rows <= 1024 else (512, 1024, 2048, 4096)
        cfgs = set()
        for L in (bd,) + Ls:
            bh = min(prev_pow2(max(1, L // bd)), next_pow2(h))
            for w in (1, 2, 4, 8, 16):
                per = bh * bd / (32 * w)
                if 1 <= per <= 32 or (bh == 1 and w == 1):
                    cfgs.add((bh, w))
        rec = dict(B=b, H=h, N=n, D=d, dtype=dt, rows=rows, bd=bd)
        rec["sf_us"], _ = time_us(lambda: sf.pack(out, lse, send), nbytes)
        tuning.OVERRIDES.clear()
        rec["table_us"], _ = time_us(lambda: pack_send(out, lse, send, n, hpr, d, p), nbytes)
        rec["cfg"] = {}
        for bh, w in sorted(cfgs):
            tuning.OVERRIDES["pack"] = tuning.Launch(bh, bd, w)
            try:
                us, _ = time_us(lambda: pack_send(out, lse, send, n, hpr, d, p), nbytes)
                rec["cfg"][f"{bh}x{w}"] = us
            except Exception as e:  # a configuration that cannot run is recorded, not fatal
                rec["cfg"][f"{bh}x{w}"] = str(e)[:80]
            finally:
                tuning.OVERRIDES.clear()
        res.append(rec)
        save(dict(copy_gbps=copy, device=torch.cuda.get_device_name(), points=res))
    print(f"{len(res)} of {len(order)} points in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
