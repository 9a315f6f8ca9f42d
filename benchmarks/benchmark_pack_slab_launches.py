"""Pack slab-kernel sweep: at grid points of a band of rows, the slab kernel at heads a program x
warps (tuning.OVERRIDES with slab=True), next to the straightforward kernel and the table; each
launch's wire buffer is first checked bit for bit against the table's. ``--copy`` times a device
copy of the same bytes instead.

    python benchmarks/benchmark_pack_slab_launches.py OUT.json MIN_ROWS MAX_ROWS
        [--budget SECONDS] [--copy]   (on a GPU)
"""
import time

import _run


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_slab_launches.py")
    _run.add_out(ap)
    ap.add_argument("min_rows", type=int, metavar="MIN_ROWS", help="rows B x H above this")
    ap.add_argument("max_rows", type=_run.positive_int, metavar="MAX_ROWS", help="... up to this")
    ap.add_argument("--budget", type=_run.positive_float, default=300.0,
                    help="seconds of points (the rest are skipped)")
    ap.add_argument("--copy", action="store_true",
                    help="time a device copy of the same bytes instead of the slab launches")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    with _run.recorded(args.out, "pack_slab_launches") as save:
        measure(save, args.budget, args.min_rows, args.max_rows, args.copy)


def measure(save, budget, lo, hi, copy_part):
    import torch
    from dcp_a2a.kernels import tuning
    from dcp_a2a.kernels.pack import lanes_of, pack
    from dcp_a2a.testing import straightforward as sf
    from dcp_a2a.testing.bench import _inputs, copy_bandwidth, grid_points, time_us

    t0 = time.time()
    copy = copy_bandwidth(1 << 30)
    res = []
    bits = lambda t: t.view(torch.int16 if t.element_size() == 2 else torch.int32)
    for (b, h, n, d, dt) in grid_points():
        if not lo < b * h <= hi or time.time() - t0 > budget:
            continue
        dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dt)
        nbytes = b * h * d * es + b * h * 4 + send.numel() * es
        rec = dict(B=b, H=h, N=n, D=d, dtype=dt, rows=b * h, cfg={})
        rec["sf_us"], _ = time_us(lambda: sf.pack(out, lse, send), nbytes)
        tuning.OVERRIDES.clear()
        rec["table_us"], _ = time_us(lambda: pack(out, lse, send, hpr), nbytes)
        if copy_part:
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            rec["copy_us"], _ = time_us(lambda: dst.copy_(src), nbytes)
        else:
            _, words, lanes_p, _ = lanes_of(out, p)
            ref = send.clone()
            for g in (4, 8, 16):
                for w in (1, 2, 4, 8, 16):
                    vectors = g * words // 4
                    if hpr % g or words % 4 or lanes_p != 1 or not 32 * w <= vectors <= 512 * w:
                        continue
                    tuning.OVERRIDES["pack"] = tuning.Launch(g, 1024, w, slab=True)
                    try:
                        send.fill_(float("nan"))
                        pack(out, lse, send, hpr)
                        if not torch.equal(bits(send), bits(ref)):
                            rec["cfg"][f"{g}x{w}"] = "MISMATCH"
                            continue
                        rec["cfg"][f"{g}x{w}"], _ = time_us(lambda: pack(out, lse, send, hpr),
                                                            nbytes)
                    finally:
                        tuning.OVERRIDES.clear()
        res.append(rec)
        save(dict(copy_gbps=copy, device=torch.cuda.get_device_name(), points=res))
    print(f"{len(res)} points in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
