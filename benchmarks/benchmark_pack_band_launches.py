"""Pack launches over one dtype and head dim at every point (B, H, N) of the grid's B x (H, N)
with rows (B x H) in (MIN_ROWS, MAX_ROWS]. The head dim
need not be one of the grid's (16-bit D=256 heads are as many lanes as fp32 D=128's).

Part "sweep": the row kernel at 1, 2, 4 or 8 heads a program x 1, 2, 4 or 8 warps, vector or
lane loads, and the slab kernel at 4, 8 or 16 heads x 1, 2, 4 or 8 warps (the row kernel where
the slab kernel does not fit), next to the table and the straightforward kernel; interleaved
rounds, every variant's wire bytes checked against the straightforward kernel's first.

Part "check": the table against a candidate table's pack rules (``--against``, a name in
``tuning.CANDIDATES``) by ``bench.grid_point`` (bytes checked; the straightforward kernel and a
copy timed alike; each table's verdict against 0.95 x the straightforward kernel, undecided ones
timed up to 9 rounds).

    python benchmarks/benchmark_pack_band_launches.py OUT.json sweep|check DTYPE D MIN_ROWS
        MAX_ROWS [--rounds 5] [--against pack_tenth_pass]   (on a GPU)
"""
import statistics
import torch
from dcp_a2a.kernels import tuning
from dcp_a2a.testing.bench import GRID_B, GRID_HN, timed_rounds
from _rounds import check_bytes, check_tables, pack_point, pack_variants
import _run


def band_points(dt, d, lo, hi):
    return [(b, h, n, d, dt) for h, n in GRID_HN for b in GRID_B if lo < b * h <= hi]


def sweep(save, pts, rounds, against=None):
    rows = []
    for pt in pts:
        p, hpr, out, lse, send, nbytes, ref = pack_point(*pt)
        variants = pack_variants(out, lse, send, hpr)
        check_bytes(variants, send, ref, pt)
        med, times, _ = timed_rounds(variants, nbytes, rounds)
        rows.append(dict(point=list(pt), median_us=med, rounds=times))
        best = min((k for k in med if k != "sf"), key=med.get)
        print(f"{pt}: sf {med['sf']:.3f} table {med['table']:.3f} "
              f"({med['table'] / med['sf']:.3f}) best {best} {med[best]:.3f} "
              f"({med[best] / med['sf']:.3f})", flush=True)
    save(dict(device=torch.cuda.get_device_name(), rounds_asked=rounds, points=rows))
    names = [k for k in rows[0]["median_us"] if k != "sf"]
    ratio = {k: [r["median_us"][k] / r["median_us"]["sf"] for r in rows] for k in names}
    for k in sorted(names, key=lambda k: statistics.median(ratio[k]))[:10] + ["table"]:
        print(f"{k:>14}: median {statistics.median(ratio[k]):.3f} worst {max(ratio[k]):.3f} "
              f"(x sf over {len(rows)} points)")


def check(save, pts, rounds, against):
    check_tables(save, pts, against, rounds, settle_rounds=9)


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_band_launches.py")
    _run.add_out(ap)
    ap.add_argument("part", choices=("sweep", "check"))
    ap.add_argument("dtype", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("head_dim", type=_run.positive_int, metavar="D")
    ap.add_argument("min_rows", type=int, metavar="MIN_ROWS", help="rows B x H above this")
    ap.add_argument("max_rows", type=_run.positive_int, metavar="MAX_ROWS", help="... up to this")
    ap.add_argument("--rounds", type=_run.positive_int, default=5, help="interleaved rounds")
    ap.add_argument("--against", default="pack_tenth_pass", choices=sorted(tuning.CANDIDATES),
                    help="check: the candidate table timed beside the table")
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    pts = band_points(args.dtype, args.head_dim, args.min_rows, args.max_rows)
    if not pts:
        ap.error(f"no grid point has more than {args.min_rows} and at most {args.max_rows} rows")
    with _run.recorded(args.out, "pack_band_launches") as save:
        {"sweep": sweep, "check": check}[args.part](save, pts, args.rounds, args.against)


if __name__ == "__main__":
    main()
