"""The pack at B=8192 D=512 where a 16-head program would straddle two peers: the table (one
peer's slab) against the straddling 16 x 256-word, 8-warp launch, in one run.

    python benchmarks/benchmark_pack_peer_slab.py OUT.json   (on a GPU)
"""
import _run


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_peer_slab.py")
    _run.add_out(ap)
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    with _run.recorded(args.out, "pack_peer_slab") as save:
        measure(save)


def measure(save):
    import torch
    from dcp_a2a.kernels import tuning
    from dcp_a2a.ops import pack_send
    from dcp_a2a.testing import straightforward as sf
    from dcp_a2a.testing.bench import _inputs, copy_bandwidth, time_us

    copy = copy_bandwidth()
    rows = []
    for dt in ("bfloat16", "float16"):
        for h, n in ((64, 8), (32, 4), (16, 2), (64, 4), (128, 8)):
            dtype, es, p, hpr, out, lse, send = _inputs(8192, h, 512, n, dt)
            nbytes = out.numel() * es + lse.numel() * 4 + send.numel() * es

            def fn(out=out, lse=lse, send=send, n=n, hpr=hpr, p=p):
                pack_send(out, lse, send, n, hpr, 512, p)

            r = dict(H=h, N=n, dtype=dt, cfg=str(tuning.launch("pack", 8192, h, 256, n)))
            r["sf"], _ = time_us(lambda: sf.pack(out, lse, send), nbytes)
            r["table"], _ = time_us(fn, nbytes)
            tuning.OVERRIDES["pack"] = tuning.Launch(16, 256, 8)
            try:
                r["straddle_16x8"], _ = time_us(fn, nbytes)
            finally:
                tuning.OVERRIDES.clear()
            r["table_pct"] = 100 * nbytes / r["table"] / 1e3 / copy
            rows.append(r)
            print(r, flush=True)
    save(dict(copy_gbps=copy, device=torch.cuda.get_device_name(), rows=rows))


if __name__ == "__main__":
    main()
