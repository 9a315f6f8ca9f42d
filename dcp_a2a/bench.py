"""Benchmark of the local work of each path on one GPU (the exchange skipped).

    python -m dcp_a2a.bench [--out bench.json] [--quick] [--sweep]

Per shape: pack, unpack-combine, packed total (pack + unpack), two_collective local work (output
permute copy + LSE staging + combine), ag_rs local work (LSE staging + weighting), and a naive
PyTorch version of pack + unpack. The device copy bandwidth is measured in the same run
(a large device-to-device copy, bytes read + written) and every row reports GB/s and % of it.
Small shapes are timed as CUDA-graph replays of many back-to-back calls; large ones with
``triton.testing.do_bench`` (median of event-timed runs). ``--sweep`` times launch variants
(dcp_a2a.tuning) for pack and unpack-combine. With several GPUs, the end-to-end exchange
benchmark runs under torchrun (see docs/perf.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

import torch

from . import tuning
from .combine import combine_separate, scale_for_reduce_scatter, unpack_combine
from .pack import lse_to_wire, pack_send
from .wire import lse_pack_dim

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
GRAPH_BYTES_LIMIT = 64 << 20  # below this many bytes moved, time graph replays


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


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    import triton.testing

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300,
                                 return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9


def time_us(fn, nbytes: int, reps_in_graph: int = 50) -> tuple[float, str]:
    import triton.testing

    if nbytes >= GRAPH_BYTES_LIMIT:
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        return ms * 1e3, "events"
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps_in_graph):
            fn()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps_in_graph)
    times.sort()
    return times[len(times) // 2], "graph"


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


def bench_shape(b, h, d, n, dtype_name, copy_gbps, sweep=False) -> list[Row]:
    dtype = getattr(torch, dtype_name)
    es = torch.empty((), dtype=dtype).element_size()
    p = lse_pack_dim(dtype)
    hpr = h // n
    out = torch.randn((b, h, d), device="cuda").to(dtype)
    lse = torch.randn((b, h), device="cuda") * 4
    send = torch.empty((n, b, hpr, d + p), dtype=dtype, device="cuda")
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="dcp-a2a-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench.json")
    ap.add_argument("--quick", action="store_true", help="only the two target shapes")
    ap.add_argument("--sweep", action="store_true", help="also time launch variants")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("dcp_a2a.bench needs a CUDA GPU (the CPU path is the Triton interpreter, which "
              "says nothing about speed)", file=sys.stderr)
        return 2
    shapes = DEFAULT_SHAPES[:1] + DEFAULT_SHAPES[2:3] if args.quick else DEFAULT_SHAPES
    copy_gbps = copy_bandwidth()
    rows = []
    for b, h, d, n, dt in shapes:
        rows += bench_shape(b, h, d, n, dt, copy_gbps, sweep=args.sweep)
    props = torch.cuda.get_device_properties(0)
    import triton

    report = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__,
              "copy_gbps": copy_gbps, "rows": [asdict(r) for r in rows]}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"device {props.name}; copy bandwidth {copy_gbps:.0f} GB/s (read + write)")
    print(table([r for r in rows if r.variant == "default"]))
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
