"""The pack above 64k rows where H/N = 16 (and the fp32 and 1024-token neighbours): the slab
kernel at G heads x warps and the row kernel (16 heads x 256 words, 8 / 16 warps) next to the
table and the straightforward kernel, in interleaved rounds. Every variant's send buffer is
first checked bit for bit against the straightforward kernel's (once, before the rounds).

    python benchmarks/benchmark_pack_large_launches.py OUT.json [--rounds 2]   (on a GPU)
"""
import _run

POINTS = [(8192, 64, 4, 512, dt) for dt in ("bfloat16", "float16", "float32")]
POINTS += [(8192, 128, 8, 512, "bfloat16"), (8192, 128, 8, 512, "float32"),
           (1024, 128, 8, 512, "float32"), (8192, 64, 8, 512, "bfloat16")]


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_large_launches.py")
    _run.add_out(ap)
    ap.add_argument("--rounds", type=_run.positive_int, default=2, help="interleaved rounds")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    with _run.recorded(args.out, "pack_large_launches") as save:
        measure(save, args.rounds)


def measure(save, rounds):
    import torch
    from dcp_a2a.kernels import tuning
    from dcp_a2a.ops import pack_send
    from dcp_a2a.testing import straightforward as sf
    from dcp_a2a.testing.bench import copy_bandwidth, timed_rounds
    from _rounds import check_bytes, pack_point, under_launch

    variants = {f"slab{g}x{w}": tuning.Launch(g, 1024, w, slab=True)
                for g in (4, 8, 16) for w in (4, 8, 16)}
    variants.update({f"row16x{w}": tuning.Launch(16, 1024, w) for w in (8, 16)})
    copy = copy_bandwidth()
    rows = []
    for (b, h, n, d, dt) in POINTS:
        p, hpr, out, lse, send, nbytes, ref = pack_point(b, h, n, d, dt)

        def table(out=out, lse=lse, send=send, n=n, hpr=hpr, d=d, p=p):
            pack_send(out, lse, send, n, hpr, d, p)

        fns = {"sf": lambda: sf.pack(out, lse, send), "table": table}
        fns.update({name: under_launch("pack", cfg, table) for name, cfg in variants.items()})
        r = dict(B=b, H=h, N=n, D=d, dtype=dt, table_launch=str(tuning.launch(
            "pack", b, h, d // 2 if out.element_size() == 2 else d, n, True)))
        check_bytes(fns, send, ref, (b, h, n, d, dt))
        r["us"], r["rounds"], _ = timed_rounds(fns, nbytes, rounds)
        r["pct_copy"] = {k: 100 * nbytes / v / 1e3 / copy for k, v in r["us"].items()}
        rows.append(r)
        best = min((v, k) for k, v in r["us"].items() if k != "sf")
        print(b, h, n, d, dt, r["table_launch"],
              "sf %.1f table %.1f (%.1f%%) best %s %.1f (%.1f%%)" % (
                  r["us"]["sf"], r["us"]["table"], r["pct_copy"]["table"], best[1], best[0],
                  r["pct_copy"][best[1]]),
              " ".join(f"{k} {v:.1f}" for k, v in r["us"].items()), flush=True)
        save(dict(copy_gbps=copy, device=torch.cuda.get_device_name(), rows=rows))


if __name__ == "__main__":
    main()
