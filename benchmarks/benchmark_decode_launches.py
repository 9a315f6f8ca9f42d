"""Launches around the table's at the decode latency target (B=1 H=128 D=512 N=8 bf16: pack +
unpack under graph replay), in interleaved rounds.

Part "target", at that shape. Pack: the row kernel at 1, 2 or 4 heads a program x 1-8 warps,
vector or lane loads, and the slab kernel at 4, 8 or 16 heads x 1-8 warps. Combine: 1 or 2
heads a program x 1-16 warps, the head in one 256-word tile. Every pack variant's wire bytes
are checked against the straightforward kernel's, every combine's output against the table's,
bit for bit, first.

Part "band": the table against a candidate table's pack rules (``--against``, a name in
``tuning.CANDIDATES``) at every grid point of 16-bit D=512 (256-lane heads) up to 256 rows, by
``bench.grid_point`` (bytes checked, the straightforward kernel and a copy timed alike).

    python benchmarks/benchmark_decode_launches.py OUT.json target|band [--rounds 7]   (on a GPU)
"""
import statistics
import torch
from dcp_a2a.kernels import tuning
from dcp_a2a.ops import unpack_combine
from dcp_a2a.testing.bench import grid_points, timed_rounds
from _rounds import check_bytes, check_tables, pack_point, pack_variants, under_launch
import _run

B, H, N, D, DT = 1, 128, 8, 512, "bfloat16"


def band(save, rounds, against):
    check_tables(save, [pt for pt in grid_points() if pt[3] == 512 and pt[4] != "float32"
                        and pt[0] * pt[1] <= 256], against, rounds)


def target(save, rounds, against=None):
    p, hpr, out, lse, send, nbytes, ref = pack_point(B, H, N, D, DT)

    pack_launches = pack_variants(out, lse, send, hpr, row_heads=(1, 2, 4))
    check_bytes(pack_launches, send, ref, (B, H, N, D, DT))
    recv = send.clone()
    combine = lambda: unpack_combine(recv, D, p, False, True)
    want = combine()
    combine_variants = {"table": combine}
    for heads in (1, 2):
        for warps in (1, 2, 4, 8, 16):
            combine_variants[f"c{heads}x{warps}"] = under_launch(
                "combine", tuning.Launch(heads, 256, warps), combine)
    for name, fn in combine_variants.items():
        assert torch.equal(fn().view(torch.int16), want.view(torch.int16)), name

    res = dict(device=torch.cuda.get_device_name(), shape=[B, H, D, N, DT], rounds_asked=rounds)
    for part, variants in (("pack", pack_launches), ("combine", combine_variants)):
        med, times, _ = timed_rounds(variants, nbytes, rounds)
        res[part] = dict(median_us=med, rounds=times)
        base = med["table"]
        for name in sorted(med, key=med.get)[:8]:
            print(f"{part} {name}: {med[name]:.3f} us ({med[name] / base:.3f} x table) "
                  f"[{min(times[name]):.3f}-{max(times[name]):.3f}]")
        print(f"{part} table {base:.3f}" + (f", sf {med['sf']:.3f}" if "sf" in med else ""))
    save(res)
    best = {k: min(v for n, v in res[k]["median_us"].items() if n != "sf")
            for k in ("pack", "combine")}
    spread = statistics.median(max(v) / min(v) for v in res["pack"]["rounds"].values())
    print(f"best pack + best combine {best['pack'] + best['combine']:.3f} us; table "
          f"{res['pack']['median_us']['table'] + res['combine']['median_us']['table']:.3f} us; "
          f"median spread {spread:.3f}")


def parser():
    ap = _run.parser(__doc__, "benchmark_decode_launches.py")
    _run.add_out(ap)
    ap.add_argument("part", choices=("target", "band"))
    ap.add_argument("--rounds", type=_run.positive_int, default=7, help="interleaved rounds")
    ap.add_argument("--against", default="pack_ninth_pass", choices=sorted(tuning.CANDIDATES),
                    help="band: the candidate table timed beside the table")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    with _run.recorded(args.out, "decode_launches") as save:
        {"band": band, "target": target}[args.part](save, args.rounds, args.against)


if __name__ == "__main__":
    main()
