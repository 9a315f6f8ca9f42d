"""Where the fp32 D=512 pack's time goes from 16k rows up, by the hardware counters: each launch
below runs twice (compile, then the one read),
under Nsight Compute, and the counters of the second are read: DRAM bytes each way, L2 sectors
and requests each way, the warps resident. The launches: the straightforward kernel, the
table's, a few of the sweeps' losers, and a plain Triton copy of as many bytes (the floor).

    ncu --clock-control none -k regex:'_pack|_copy' --csv \\
        --metrics $(python benchmarks/benchmark_pack_dram_traffic.py metrics) \\
        python benchmarks/benchmark_pack_dram_traffic.py run LABELS.json > NCU.csv
    python benchmarks/benchmark_pack_dram_traffic.py check   (the variants' bytes, outside the
        profiler)
    python benchmarks/benchmark_pack_dram_traffic.py table LABELS.json NCU.csv OUT.json

ncu flushes the caches before each launch it reads (``--cache-control all``, its default): a
cold L2. With ``--cache-control none --replay-mode application`` the read launch follows its
compile launch as the benchmark's back-to-back calls follow each other: the L2 then holds the
last call's dirty wire lines, which this call's traffic must write back.
"""
import csv, json

import _run

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum",
           "lts__t_requests_op_write.sum", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed")
POINTS = [(256, 128, 8), (1024, 64, 8), (512, 32, 4)]


def run(labels_path, check=False):
    """Each variant twice (``check``: instead, each variant's bytes against the
    straightforward kernel's, outside the profiler: its launches would be read too)."""
    import torch
    from dcp_a2a.kernels import tuning
    from benchmark_copy_bandwidth import triton_copy
    from _rounds import check_bytes, copy_pair, pack_point, pack_under, packs

    labels = []
    for b, h, n in POINTS:
        p, hpr, out, lse, send, nbytes, ref = pack_point(b, h, n, 512, "float32")
        labels.append(dict(variant=None, launches=1))  # pack_point's straightforward pack
        v = packs(out, lse, send, hpr)
        for name, cfg in (("row1x1_token_major", tuning.Launch(1, 1024, 1)),
                          ("row1x4", tuning.Launch(1, 1024, 4, head_major=True)),
                          ("row1x1_lane", tuning.Launch(1, 1024, 1, lane_loads=True,
                                                        head_major=True)),
                          ("slab4x2", tuning.Launch(4, 1024, 2, slab=True, head_major=True))):
            v[name] = pack_under(cfg, out, lse, send, hpr)
        if check:
            check_bytes(v, send, ref, (b, h, n))
            continue
        src, dst = copy_pair(nbytes)
        v["copy4096x8"] = triton_copy(src, dst, 4096, 8)
        torch.cuda.synchronize()
        for name, fn in v.items():
            for _ in range(2):
                fn()
            labels.append(dict(B=b, H=h, N=n, variant=name, nbytes=nbytes, launches=2))
        torch.cuda.synchronize()
    if not check:
        json.dump(labels, open(labels_path, "w"), indent=1)


def table(labels_path, csv_path, out_path):
    with _run.recorded(out_path, "pack_dram_traffic") as save:
        _table(labels_path, csv_path, save)


def _table(labels_path, csv_path, save):
    labels = json.load(open(labels_path))
    lines = [l for l in open(csv_path).read().splitlines() if l.startswith('"')]  # not ==PROF==
    by_id = {}
    for r in csv.DictReader(lines):
        by_id.setdefault(int(r["ID"]), {})[r["Metric Name"]] = (
            float(r["Metric Value"].replace(",", "")), r["Metric Unit"])
    ids = sorted(by_id)
    if len(ids) != sum(lab["launches"] for lab in labels):
        raise SystemExit(f"{len(ids)} launches profiled, {labels} expected")
    rows, last = [], -1
    for lab in labels:
        last += lab["launches"]  # the label's last launch is the one read
        if lab["variant"] is None:
            continue
        m = {k: v for k, (v, _) in by_id[ids[last]].items()}
        unit = by_id[ids[last]]["gpu__time_duration.sum"][1]
        us = m["gpu__time_duration.sum"] / (1e3 if unit in ("ns", "nsecond") else 1)
        rows.append(dict(lab, us=us, metrics=m))
    for r in rows:
        m, nb = r["metrics"], r["nbytes"]
        print(f"{r['B']:5d} {r['H']:4d} {r['N']} {r['variant']:20s} {r['us']:8.2f} us  "
              f"dram rd {m['dram__bytes_read.sum'] / (nb / 2):.3f} wr "
              f"{m['dram__bytes_write.sum'] / (nb / 2):.3f} (x bytes each way)  "
              f"L2 sectors rd {m['lts__t_sectors_op_read.sum'] * 32 / (nb / 2):.3f} wr "
              f"{m['lts__t_sectors_op_write.sum'] * 32 / (nb / 2):.3f}  wr requests "
              f"{m['lts__t_requests_op_write.sum'] / 1e3:.0f}k  warps "
              f"{m['sm__warps_active.avg.pct_of_peak_sustained_active']:.0f}%  dram "
              f"{m['dram__throughput.avg.pct_of_peak_sustained_elapsed']:.0f}%")
    save({"rows": rows})


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_dram_traffic.py")
    sub = ap.add_subparsers(dest="step", required=True)
    sub.add_parser("metrics", help="the counters, for ncu's --metrics")
    sub.add_parser("run", help="each launch twice, under ncu").add_argument("labels")
    sub.add_parser("check", help="the variants' bytes, outside the profiler")
    t = sub.add_parser("table", help="ncu's CSV to OUT.json and OUT.md")
    t.add_argument("labels")
    t.add_argument("csv")
    t.add_argument("out", metavar="OUT.json")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    if args.step == "metrics":
        print(",".join(METRICS))
    elif args.step == "run":
        run(args.labels)
    elif args.step == "check":
        run(None, check=True)
    else:
        table(args.labels, args.csv, args.out)


if __name__ == "__main__":
    main()
