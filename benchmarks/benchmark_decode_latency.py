"""The decode latency target (B=1 H=128 D=512 N=8 bf16: pack + unpack under CUDA-graph
replay), timed in interleaved rounds next to the straightforward kernels (the spread between
rounds is the noise one timing carries at the launch floor).

    python benchmarks/benchmark_decode_latency.py OUT.json [--rounds 9]   (on a GPU)
"""
import _run


def parser():
    ap = _run.parser(__doc__, "benchmark_decode_latency.py")
    _run.add_out(ap)
    ap.add_argument("--rounds", type=_run.positive_int, default=7, help="interleaved rounds")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    import torch
    from dcp_a2a.ops import pack_send, unpack_combine
    from dcp_a2a.testing import straightforward as sf
    from dcp_a2a.testing.bench import _inputs, timed_rounds

    with _run.recorded(args.out, "decode_latency") as save:
        b, h, d, n, dt = 1, 128, 512, 8, "bfloat16"
        dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dt)
        nbytes = out.numel() * es + lse.numel() * 4 + send.numel() * es
        pack_send(out, lse, send, n, hpr, d, p)
        variants = {"pack": lambda: pack_send(out, lse, send, n, hpr, d, p),
                    "pack_sf": lambda: sf.pack(out, lse, send),
                    "unpack": lambda: unpack_combine(send, d, p, False, True),
                    "unpack_sf": lambda: sf.unpack_combine(send, d)}
        med, times, _ = timed_rounds(variants, nbytes, args.rounds)
        res = dict(device=torch.cuda.get_device_name(), shape=[b, h, d, n, dt], median_us=med,
                   rounds=times, pack_plus_unpack_us=med["pack"] + med["unpack"],
                   worst_round_sum_us=max(a + c for a, c in zip(times["pack"], times["unpack"])))
        save(res)
        print(" ".join(f"{k} {v:.3f} [{min(times[k]):.3f}-{max(times[k]):.3f}]"
                       for k, v in med.items()))
        print(f"pack + unpack {res['pack_plus_unpack_us']:.3f} us (median of {args.rounds} "
              f"rounds), worst round {res['worst_round_sum_us']:.3f} us")


if __name__ == "__main__":
    main()
