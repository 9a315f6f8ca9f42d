"""The pack's row kernel at 1, 2, 4 or 8 heads a program x 1, 2, 4 or 8 warps, vector or lane
loads, and its slab kernel at 4, 8 or 16 heads x 1, 2, 4 or 8 warps (the row kernel where the
slab kernel does not fit), next to the table and the straightforward kernel, at every grid point of one dtype and
head dim with rows (B x H) in (MIN_ROWS, MAX_ROWS]; interleaved rounds, every variant's wire
bytes checked against the straightforward kernel's first (docs/perf.md, eleventh pass).

    python docs/perf_data/pack_band_sweep.py OUT.json DTYPE D MIN_ROWS MAX_ROWS [ROUNDS]
        (on a GPU; PYTHONPATH=.)
"""
import json, statistics, sys
import torch
from dcp_a2a.kernels import tuning
from dcp_a2a.testing.bench import grid_points, timed_rounds
from _rounds import check_bytes, pack_point, pack_under, packs


def variants_at(out, lse, send, hpr):
    v = packs(out, lse, send, hpr)
    for heads in (1, 2, 4, 8):
        for warps in (1, 2, 4, 8):
            for lane in (False, True):
                cfg = tuning.Launch(heads, 1024, warps, lane_loads=lane)
                v[f"row{heads}x{warps}" + "_lane" * lane] = pack_under(cfg, out, lse, send, hpr)
    for heads in (4, 8, 16):
        for warps in (1, 2, 4, 8):
            cfg = tuning.Launch(heads, 1024, warps, slab=True)
            v[f"slab{heads}x{warps}"] = pack_under(cfg, out, lse, send, hpr)
    return v


def main(out_json, dt, d, lo, hi, rounds):
    pts = [p for p in grid_points() if p[4] == dt and p[3] == d and lo < p[0] * p[1] <= hi]
    rows = []
    for pt in pts:
        p, hpr, out, lse, send, nbytes, ref = pack_point(*pt)
        variants = variants_at(out, lse, send, hpr)
        check_bytes(variants, send, ref, pt)
        med, times, _ = timed_rounds(variants, nbytes, rounds)
        rows.append(dict(point=list(pt), median_us=med, rounds=times))
        best = min((k for k in med if k != "sf"), key=med.get)
        print(f"{pt}: sf {med['sf']:.3f} table {med['table']:.3f} "
              f"({med['table'] / med['sf']:.3f}) best {best} {med[best]:.3f} "
              f"({med[best] / med['sf']:.3f})", flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), dtype=dt, D=d, rows_band=[lo, hi],
                   rounds_asked=rounds, points=rows), open(out_json, "w"), indent=1)
    names = [k for k in rows[0]["median_us"] if k != "sf"]
    ratio = {k: [r["median_us"][k] / r["median_us"]["sf"] for r in rows] for k in names}
    for k in sorted(names, key=lambda k: statistics.median(ratio[k]))[:10] + ["table"]:
        print(f"{k:>14}: median {statistics.median(ratio[k]):.3f} worst {max(ratio[k]):.3f} "
              f"(x sf over {len(rows)} points)")


if __name__ == "__main__":
    a = sys.argv
    main(a[1], a[2], int(a[3]), int(a[4]), int(a[5]), int(a[6]) if len(a) > 6 else 5)
