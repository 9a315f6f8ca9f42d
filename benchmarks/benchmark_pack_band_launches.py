"""Pack launches over one dtype and head dim at every point (B, H, N) of the grid's B x (H, N)
with rows (B x H) in (MIN_ROWS, MAX_ROWS] (docs/perf_history.md, eleventh pass). The head dim
need not be one of the grid's (16-bit D=256 heads are as many lanes as fp32 D=128's).

Part "sweep": the row kernel at 1, 2, 4 or 8 heads a program x 1, 2, 4 or 8 warps, vector or
lane loads, and the slab kernel at 4, 8 or 16 heads x 1, 2, 4 or 8 warps (the row kernel where
the slab kernel does not fit), next to the table and the straightforward kernel; interleaved
rounds, every variant's wire bytes checked against the straightforward kernel's first.

Part "check": the table against the tenth pass's pack rules (``pack_tenth_pass``) by
``bench.grid_point`` (bytes checked; the straightforward kernel and a copy timed alike; each
table's verdict against 0.95 x the straightforward kernel, undecided ones timed up to 9 rounds).

    python docs/perf_data/pack_band_sweep.py OUT.json sweep|check DTYPE D MIN_ROWS MAX_ROWS
        [ROUNDS]   (on a GPU; PYTHONPATH=.)
"""
import json, statistics, sys
import torch
from dcp_a2a.testing.bench import GRID_B, GRID_HN, timed_rounds
from _rounds import check_bytes, check_tables, pack_point, pack_variants


def band_points(dt, d, lo, hi):
    return [(b, h, n, d, dt) for h, n in GRID_HN for b in GRID_B if lo < b * h <= hi]


def sweep(out_json, pts, rounds):
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
    json.dump(dict(device=torch.cuda.get_device_name(), rounds_asked=rounds, points=rows),
              open(out_json, "w"), indent=1)
    names = [k for k in rows[0]["median_us"] if k != "sf"]
    ratio = {k: [r["median_us"][k] / r["median_us"]["sf"] for r in rows] for k in names}
    for k in sorted(names, key=lambda k: statistics.median(ratio[k]))[:10] + ["table"]:
        print(f"{k:>14}: median {statistics.median(ratio[k]):.3f} worst {max(ratio[k]):.3f} "
              f"(x sf over {len(rows)} points)")


def check(out_json, pts, rounds):
    check_tables(out_json, pts, "pack_tenth_pass", rounds, settle_rounds=9)


if __name__ == "__main__":
    a = sys.argv
    pts = band_points(a[3], int(a[4]), int(a[5]), int(a[6]))
    {"sweep": sweep, "check": check}[a[2]](a[1], pts, int(a[7]) if len(a) > 7 else 5)
