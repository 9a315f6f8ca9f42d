"""Pack program order: at every grid point of more than
1024 rows, the table as landed (token-major grid: programs dispatched one after another take one
head block of consecutive tokens, H x D elements apart in ``out``) against the same rules on a
head-major grid (they take one token's consecutive heads), and slab-kernel launches in both
orders; next to the straightforward kernel and a device copy of the same bytes. Rounds
interleave the variants (their spread is the noise); each variant's send buffer is first checked
bit for bit against the straightforward kernel's. Part "sweep": only heads of 512 lanes (fp32
D=512) above 8k rows, head-major launches of both kernels at other program sizes and warps, and
the row kernel with streaming cache hints. With a band of rows (``sweep --band LO HI``: more
than LO, at most HI; e.g. 0 1024 and 1024 16384), the same launches in both grid orders (a
tile is the head's lanes at most: ``tuning.launch``); at most 1024 rows also 8 and 16 warps a
head and the row kernel's loads in the stores' layout (``_ll``), no slabs.

    python benchmarks/benchmark_pack_grid_order.py OUT.json [sweep [--band LO HI]]
        [--budget SECONDS]   (on a GPU)
"""
import statistics, time
from dataclasses import replace

import _run


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_grid_order.py")
    _run.add_out(ap)
    ap.add_argument("part", nargs="?", choices=("sweep",),
                    help="only 512-lane heads, more launches (see above)")
    ap.add_argument("--band", nargs=2, type=float, metavar=("LO", "HI"),
                    help="sweep: rows B x H above LO, up to HI, both grid orders")
    ap.add_argument("--budget", type=_run.positive_float, default=300.0,
                    help="seconds of points (the rest are skipped)")
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    if args.band is not None and args.part != "sweep":
        ap.error("--band goes with the sweep part")
    with _run.recorded(args.out, "pack_grid_order") as save:
        measure(save, args)


def measure(save, args):
    import torch
    from dcp_a2a.kernels import tuning
    from dcp_a2a.kernels.pack import lanes_of, slab_fits, pack
    from dcp_a2a.testing import straightforward as sf
    from dcp_a2a.testing.bench import grid_points, copy_bandwidth, timed_rounds
    from _rounds import check_bytes, pack_point, pack_under

    t0, budget = time.time(), args.budget
    HM = {**tuning.TABLE, "pack": tuple(
        replace(r, head_major=True) for r in tuning.TABLE["pack"])}
    SLABS = {"slab4x2": tuning.Launch(4, 1024, 2, slab=True),
             "slab4x2_hm": tuning.Launch(4, 1024, 2, slab=True, head_major=True),
             "slab8x4": tuning.Launch(8, 1024, 4, slab=True),
             "slab8x4_hm": tuning.Launch(8, 1024, 4, slab=True, head_major=True)}
    L = tuning.Launch
    band, banded = (8192, float("inf")), False
    if args.part == "sweep":
        HM = None
        banded = args.band is not None
        band = tuple(args.band) if banded else band
        decode = band[1] <= 1024  # more warps a head, loads in the stores' layout, no slabs
        rows_hw = ((1, 1), (1, 2), (1, 4), (2, 2), (2, 4)) + (((1, 8), (1, 16), (2, 8)) if decode
                                                             else ())
        SLABS = {}
        for hm in (False, True) if banded else (True,):
            sfx = "_hm" if hm else ""
            if not decode:
                SLABS.update({f"slab{g}x{w}{sfx}": L(g, 1024, w, slab=True, head_major=hm)
                              for g, w in ((4, 1), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8))})
            for ll in (False, True) if decode else (False,):
                SLABS.update({f"row{hb}x{w}{sfx}" + ("_ll" if ll else ""):
                              L(hb, 1024, w, head_major=hm, lane_loads=ll) for hb, w in rows_hw})
        if not banded:
            SLABS["row1x1_hm_stream"] = L(1, 1024, 1, stream=True, head_major=True)
    copy = copy_bandwidth(1 << 30)
    pts = [p for p in grid_points() if p[0] * p[1] > min(1024, band[0])]
    if HM is None:
        pts = [p for p in pts if band[0] < p[0] * p[1] <= band[1] and p[3] == 512
               and p[4] == "float32"]
    pts.sort(key=lambda p: (not (p[4] == "float32" and p[3] == 512), p[0] * p[1] * p[3]))
    rows = []
    for (b, h, n, d, dt) in pts:
        if time.time() - t0 > budget:
            break
        p, hpr, out, lse, send, nbytes, ref = pack_point(b, h, n, d, dt)
        src, lanes, lanes_p, _ = lanes_of(out, p)
        fits = slab_fits(src, lanes, lanes_p, hpr)

        def with_table(t):
            def run():
                tuning.ACTIVE = t
                try:
                    pack(out, lse, send, hpr)
                finally:
                    tuning.ACTIVE = tuning.TABLE
            return run

        def with_override(cfg):
            return pack_under(cfg, out, lse, send, hpr)

        c_src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        c_dst = torch.empty_like(c_src)
        variants = {"sf": lambda: sf.pack(out, lse, send), "table": with_table(tuning.TABLE)}
        if HM is not None:
            variants["hm"] = with_table(HM)
        elif banded:  # the table before the eighth pass too
            variants["seventh"] = with_table(tuning.CANDIDATES["pack_seventh_pass"])
        variants.update({k: with_override(c) for k, c in SLABS.items()
                         if (fits or not c.slab) and hpr % c.block_h == 0})
        check_bytes(variants, send, ref, (b, h, n, d, dt))
        variants["copy"] = lambda: c_dst.copy_(c_src)
        us, times, _ = timed_rounds(variants, nbytes)
        r = dict(B=b, H=h, N=n, D=d, dtype=dt, us=us, rounds=times)
        r["ratio"] = {k: r["us"][k] / r["us"]["sf"] for k in variants if k != "sf"}
        rows.append(r)
        print(b, h, n, d, dt, " ".join(f"{k} {v:.2f}" for k, v in r["us"].items()), "|",
              " ".join(f"{k} {v:.3f}" for k, v in r["ratio"].items()), flush=True)
        save(dict(device=torch.cuda.get_device_name(), copy_gbps=copy, rows=rows))
    for k in rows[0]["ratio"] if rows else ():
        rs = [r["ratio"][k] for r in rows if k in r["ratio"]]
        print(f"{k}: worst {max(rs):.3f} median {statistics.median(rs):.3f} "
              f"> 0.95: {sum(x > 0.95 for x in rs)} of {len(rs)}")
    print(f"{len(rows)} of {len(pts)} points in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
