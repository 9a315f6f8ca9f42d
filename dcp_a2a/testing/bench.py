"""``dcp-a2a bench``: the local work of each path on one GPU (the exchange skipped), and the
other benchmarks behind one command.

    dcp-a2a bench [--out bench.json] [--quick] [--sweep]
    dcp-a2a bench --grid [--quick] [--tables table,...] [--rounds 3] [--settle-rounds 9]
        [--target 0.95] [--out f.json]                                     (:mod:`.bench_grid`)
    torchrun --nproc-per-node N -m dcp_a2a bench --collective [--shapes BxH,...] [--out f.json]
                                                                     (:mod:`.bench_collective`)

Per shape: pack, unpack-combine, packed total (pack + unpack), two_collective local work (output
permute copy + LSE staging + combine), ag_rs local work (LSE staging + weighting), and a naive
PyTorch version of pack + unpack. The device copy bandwidth is measured in the same run
(a large device-to-device copy, bytes read + written) and every row reports GB/s and % of it;
how a kernel is timed: :mod:`.timing`. Beside the graph replays, the decode shapes get eager-call
times (:mod:`dcp_a2a.testing.eager`: back-to-back calls synchronised at the end, median of the
repeats) of our pack_send and unpack_combine, the engine-design baseline's wrapper, lse_reduce
(packed, a group of one) and the floor (an empty kernel launched with the same arguments): the
"eager" part of the JSON and its own table. ``--sweep`` times launch variants
(dcp_a2a.kernels.tuning) for pack and unpack-combine. (``python -m dcp_a2a.testing.bench`` and
the ``dcp-a2a-bench`` script are the same program.)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

import torch

from . import args as a
from . import eager
from ..kernels import tuning
from ..kernels.combine import combine_separate, scale_for_reduce_scatter
from ..ops import pack_send, unpack_combine
from ..kernels.pack import lse_to_wire
from ..wire import lse_pack_dim
from .timing import TARGET_RATIO, copy_bandwidth, time_us

SUMMARY = ("kernel timings on one GPU (--grid: against the baselines; --collective: the "
           "exchange end to end, under torchrun)")
DESCRIPTION = __doc__.split("\n\n")[0].replace("``", "")
# calls of one timing at most: more only looks like a hang
MAX_CALLS = 1_000_000
MAX_ROUNDS = 1000


DEFAULT_SHAPES = [
    # (B, H, D, N, dtype)       upstream microbenchmark, then decode shapes, then small heads
    (8192, 64, 512, 4, "bfloat16"),
    (8192, 64, 512, 8, "bfloat16"),
    (1, 128, 512, 8, "bfloat16"),
    (16, 128, 512, 8, "bfloat16"),
    (128, 128, 512, 8, "bfloat16"),
    (512, 128, 512, 8, "bfloat16"),
    (256, 32, 128, 4, "float16"),
    (256, 32, 128, 4, "float32"),
]


# Eager-call times at shapes of at most this many rows (B x H): above, the GPU's work, not the
# host's, sets the time of back-to-back eager calls.
EAGER_MAX_ROWS = 16384


@dataclass
class Row:
    shape: str
    op: str
    variant: str
    us: float
    bytes: int
    gbps: float
    pct_copy: float
    method: str


def naive_torch(out, lse, send, n, hpr, d):
    """Pack and unpack-combine in plain PyTorch ops (the baseline an engine would start from)."""
    b = out.shape[0]
    send[..., :d].copy_(out.view(b, n, hpr, d).transpose(0, 1))
    lanes = send.view(torch.int16 if send.element_size() == 2 else torch.int32)[..., d:]
    lanes.copy_(lse.float().view(b, n, hpr).transpose(0, 1).contiguous()
                .view(lanes.dtype).view(lanes.shape))
    recv = send
    lse_r = recv.view(lanes.dtype)[..., d:].contiguous().view(torch.float32).squeeze(-1)
    w = torch.softmax(lse_r, dim=0)
    return (w[..., None] * recv[..., :d].float()).sum(0).to(out.dtype)


def _inputs(b, h, d, n, dtype_name):
    """(dtype, element size, P, H/N, out[B, H, D], lse[B, H] fp32, send[N, B, H/N, D+P]) on
    the GPU, random (never zeros: they hide unwritten outputs and time differently)."""
    dtype = getattr(torch, dtype_name)
    p = lse_pack_dim(dtype)
    out = torch.randn((b, h, d), device="cuda").to(dtype)
    lse = torch.randn((b, h), device="cuda") * 4
    send = torch.empty((n, b, h // n, d + p), dtype=dtype, device="cuda")
    return dtype, out.element_size(), p, h // n, out, lse, send


def bench_shape(b, h, d, n, dtype_name, copy_gbps, sweep=False) -> list[Row]:
    dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dtype_name)
    pack_send(out, lse, send, n, hpr, d, p)
    recv = send.clone()
    data_send = torch.empty((n, b, hpr, d), dtype=dtype, device="cuda")
    lse_send = torch.empty((n, b, hpr), dtype=torch.float32, device="cuda")
    lse_local = torch.empty((b, h), dtype=torch.float32, device="cuda")
    lse_all = (torch.randn((n, b, h), device="cuda") * 4)
    scaled = torch.empty((n, b, hpr, d), dtype=dtype, device="cuda")
    shape = f"B={b} H={h} D={d} N={n} {dtype_name}"

    wire = n * b * hpr * (d + p) * es
    io = b * h * d * es
    merged = b * hpr * d * es
    ops = {
        "pack": (lambda: pack_send(out, lse, send, n, hpr, d, p), io + b * h * 4 + wire),
        "unpack_combine": (lambda: unpack_combine(recv, d, p, False, True), wire + merged),
        "packed_total": (lambda: (pack_send(out, lse, send, n, hpr, d, p),
                                  unpack_combine(send, d, p, False, True)),
                         io + b * h * 4 + 2 * wire + merged),
        "two_collective_local": (
            lambda: (data_send.copy_(out.unflatten(1, (n, hpr)).transpose(0, 1)),
                     lse_to_wire(lse, lse_send, n),
                     combine_separate(data_send, lse_send, False, True)),
            2 * io + b * h * 8 + io + b * h * 4 + merged),
        "ag_rs_local": (lambda: (lse_to_wire(lse, lse_local, n),
                                 scale_for_reduce_scatter(out, lse_all, 0, False, True, scaled)),
                        b * h * 8 + n * b * h * 4 + 2 * io),
        "naive_torch": (lambda: naive_torch(out, lse, send, n, hpr, d),
                        io + b * h * 4 + 2 * wire + merged),
    }
    rows = []
    for name, (fn, nbytes) in ops.items():
        us, method = time_us(fn, nbytes)
        gbps = nbytes / (us * 1e-6) / 1e9
        rows.append(Row(shape, name, "default", us, nbytes, gbps, 100 * gbps / copy_gbps, method))
    if sweep:
        rows += _sweep(shape, ops, copy_gbps, h, hpr, d)
    return rows


def _sweep(shape, ops, copy_gbps, h, hpr, d) -> list[Row]:
    rows = []
    for which, op in (("pack", "pack"), ("combine", "unpack_combine")):
        heads = h if which == "pack" else hpr
        for bh, bd, nw, stream in _variants(heads, d):
            tuning.OVERRIDES[which] = tuning.Launch(bh, bd, nw, stream)
            fn, nbytes = ops[op]
            try:
                us, method = time_us(fn, nbytes)
            finally:
                tuning.OVERRIDES.pop(which, None)
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append(Row(shape, op, f"bh={bh} bd={bd} w={nw}" + " cs" * stream, us,
                            nbytes, gbps, 100 * gbps / copy_gbps, method))
    return rows


def _variants(heads, d):
    """Launch variants around the defaults (block sizes count 32-bit words on the paired path)."""
    for bh in (1, 2, 4, 8, 16, 32):
        if bh > heads:
            continue
        for bd in (64, 128, 256, 512):
            if bd > max(64, d) or bh * bd > 8192 or bh * bd < 64:
                continue
            for nw in (2, 4, 8):
                for stream in (False, True):
                    yield bh, bd, nw, stream


def table(rows: list[Row]) -> str:
    head = f"{'shape':34} {'op':22} {'variant':18} {'us':>9} {'GB/s':>8} {'%copy':>6} {'timing':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.shape:34} {r.op:22} {r.variant:18} {r.us:9.2f} {r.gbps:8.0f} "
                     f"{r.pct_copy:6.1f} {r.method:>6}")
    return "\n".join(lines)



def _tables(value: str) -> list[str]:
    return a.items(tuple(tuning.CANDIDATES), "launch table")(value)


# flag -> the mode it belongs to (None: the default kernel benchmark)
MODE_OF = {"tables": "grid", "rounds": "grid", "settle_rounds": "grid", "target": "grid",
           "shapes": "collective", "head_dim": "collective", "iters": "collective",
           "sweep": None, "eager_calls": None, "eager_repeats": None}
DEFAULTS = {"rounds": 3, "settle_rounds": 9, "target": TARGET_RATIO, "head_dim": 512,
            "iters": 50, "eager_calls": eager.CALLS, "eager_repeats": eager.REPEATS}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", default="bench.json", type=a.out_file,
                    help="JSON report (rank 0 with --collective; its directory is created if "
                         "missing; default bench.json)")
    ap.add_argument("--quick", action="store_true",
                    help="only the two target shapes (with --grid: a corner of the grid)")
    ap.add_argument("--sweep", action="store_true",
                    help="also time launch variants (not with --grid or --collective)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--grid", action="store_true",
                      help="ours next to the straightforward design (dcp_a2a.testing."
                           "straightforward) and, for the unpack, the engine-design baseline "
                           "(dcp_a2a.testing.engine_design) over the decode grid, with the "
                           "ratios")
    mode.add_argument("--collective", action="store_true",
                      help="under torchrun: time lse_reduce end to end per backend")
    ap.add_argument("--tables", default=None, type=_tables, metavar="T1,T2",
                    help="with --grid: distinct launch tables to compare (dcp_a2a.kernels."
                         "tuning.CANDIDATES; the first is reported; default table)")
    ap.add_argument("--rounds", type=a.count(1, MAX_ROUNDS), default=None,
                    help=f"with --grid: interleaved timing rounds a point, 1 to {MAX_ROUNDS} "
                         f"(medians reported; default {DEFAULTS['rounds']})")
    ap.add_argument("--settle-rounds", type=a.count(0, MAX_ROUNDS), default=None,
                    help="with --grid: rounds in all for an op whose verdict is undecided after "
                         "--rounds (no more rounds when not above --rounds; default "
                         f"{DEFAULTS['settle_rounds']})")
    ap.add_argument("--target", type=a.number(0, lo_open=True, what="ratio"), default=None,
                    help="with --grid: the verdict's bound on ours / straightforward (default "
                         f"{DEFAULTS['target']})")
    ap.add_argument("--shapes", default=None, type=a.shapes("BxH", example="16x128"),
                    help="with --collective: distinct BxH,BxH,... (D=--head-dim; H divisible by "
                         "the world size)")
    ap.add_argument("--head-dim", type=a.count(1), default=None,
                    help="with --collective: the head dim D of every shape (default "
                         f"{DEFAULTS['head_dim']})")
    ap.add_argument("--iters", type=a.count(1, MAX_ROUNDS * 10), default=None,
                    help=f"with --collective: timed lse_reduce calls per backend and shape, 1 "
                         f"to {MAX_ROUNDS * 10} (the median is reported; default "
                         f"{DEFAULTS['iters']})")
    ap.add_argument("--eager-calls", type=a.count(1, MAX_CALLS), default=None,
                    help="eager-call timing: back-to-back calls a repeat (one synchronise at "
                         f"the end), 1 to {MAX_CALLS} (default {DEFAULTS['eager_calls']})")
    ap.add_argument("--eager-repeats", type=a.count(1, MAX_ROUNDS), default=None,
                    help=f"eager-call timing: repeats, 1 to {MAX_ROUNDS} (the median is "
                         f"reported; default {DEFAULTS['eager_repeats']})")


def check(parser, args) -> None:
    """Flags of one mode refused in another (a flag that would be ignored); the defaults filled
    in; then ``--collective`` outside torchrun, once its arguments are known to be right."""
    mode = "grid" if args.grid else "collective" if args.collective else None
    if args.quick and mode == "collective":
        parser.error("argument --quick: not with --collective (give --shapes)")
    for dest, belongs in MODE_OF.items():
        if getattr(args, dest) not in (None, False) and belongs != mode:
            flag = "--" + dest.replace("_", "-")
            parser.error(f"argument {flag}: only with --{belongs}" if belongs else
                         f"argument {flag}: not with --{mode}")
    for dest, value in DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    if args.collective:
        from .args import under_torchrun

        if not under_torchrun():
            parser.error("--collective times the exchange between ranks: run it under torchrun, "
                         "e.g. torchrun --nproc-per-node 2 -m dcp_a2a bench --collective")


def main(args=None) -> int:
    """``dcp-a2a bench``; ``args``: its parsed arguments, or an argument list (the console
    script ``dcp-a2a-bench`` and ``python -m dcp_a2a.testing.bench``)."""
    from . import cli

    args = cli.arguments("bench", args)
    if args.collective:
        from . import bench_collective

        try:
            return bench_collective.run(args)
        except ValueError as e:
            import os

            if os.environ.get("RANK", "0") == "0":
                print(f"dcp-a2a bench: error: {e}", file=sys.stderr)
            return a.EXIT_USAGE
    if not torch.cuda.is_available():
        print("dcp-a2a bench: needs a CUDA GPU (the CPU path is the Triton interpreter, which "
              "says nothing about speed)", file=sys.stderr)
        return 3
    if args.grid:
        from .bench_grid import grid_main

        return grid_main(args)
    shapes = DEFAULT_SHAPES[:1] + DEFAULT_SHAPES[2:3] if args.quick else DEFAULT_SHAPES
    copy_gbps = copy_bandwidth()
    rows = []
    for b, h, d, n, dt in shapes:
        rows += bench_shape(b, h, d, n, dt, copy_gbps, sweep=args.sweep)
    props = torch.cuda.get_device_properties(0)
    import triton

    eager_rows = []
    for b, h, d, n, dt in shapes:
        if b * h <= EAGER_MAX_ROWS:  # decode sizes, where a call's host time is its time
            eager_rows += eager.eager_rows(b, h, d, n, dt, "cuda", args.eager_calls,
                                           args.eager_repeats)
    report = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__,
              "copy_gbps": copy_gbps, "rows": [asdict(r) for r in rows], "eager": eager_rows}
    from .outpaths import make_parent

    with open(make_parent(args.out), "w") as f:
        json.dump(report, f, indent=1)
    print(f"device {props.name}; copy bandwidth {copy_gbps:.0f} GB/s (read + write)")
    print(table([r for r in rows if r.variant == "default"]))
    if eager_rows:
        print()
        print(eager.eager_table(eager_rows))
    if args.sweep:
        best = {}
        for r in rows:
            k = (r.shape, r.op)
            if r.variant != "default" and (k not in best or r.us < best[k].us):
                best[k] = r
        print("\nbest sweep variant per (shape, op):")
        print(table(list(best.values())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
