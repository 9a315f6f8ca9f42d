"""MLA up-projection around the DCP exchange: project before the exchange or after the merge.

    python benchmarks/benchmark_up_projection.py OUT.json [--write]
    python benchmarks/benchmark_up_projection.py OUT.json --smoke   # CPU, tiny shapes, seconds
    torchrun --nproc-per-node N benchmarks/benchmark_up_projection.py OUT.json --distributed

One GPU (the default): at H heads, latent width L, value width V (DeepSeek-V3: 128, 512, 128),
for each DCP size N (4 and 8) and token count B (1 to 8192), the local work of one rank in both
orders, with the exchange left out (the combine reads the send buffer, which has the receive
buffer's size and layout):

    before_exchange   project(out[B, H, L], W[H, L, V]) -> pack V + P lanes -> combine
    after_merge       pack L + P lanes -> combine -> project(latent[B, H/N, L], W[own heads])

through the product's own ops (dcp_a2a.kernels.project.project, pack_send, unpack_combine: what
``lse_reduce(w_uv=W, up_proj=...)`` runs), timed in interleaved rounds (CUDA-graph replays below
1 GiB moved, CUDA events above: dcp_a2a.testing.timing.timed_rounds) with a 95 % interval of the
time ratio before_exchange / after_merge (timing.ratio_verdict); and the bytes each order puts on
the wire (to the N - 1 peers). The crossover per N is the smallest B from which projecting
first was faster at every larger B measured (medians; the interval says how sure). ``--write``
stores the card's crossovers in dcp_a2a/up_projection_switch.json, which
``lse_reduce(up_proj="auto")`` then uses on this card at this shape (dcp_a2a.up_projection).
The wire is left out of the crossover: it only favours projecting first, so on real ranks the
best switch is at or below it.

``--distributed`` (torchrun, one GPU a rank, NCCL; gloo on CPU as a smoke test of the path):
``lse_reduce`` end to end on the real group, with the up-projection in each order and without
it (the latent merge alone), per B; written for any N.

``--smoke``: H=4, L=32, V=8, N=2, B = 1 and 4, two rounds, on this machine's device (the
CPU: Triton's interpreter and the wall clock): checks the script, not the card.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

import dcp_a2a
from dcp_a2a.kernels.project import project
from dcp_a2a.up_projection import DATA_FILE, byte_model_switch

import _run

BATCHES = tuple(1 << i for i in range(14))  # 1 .. 8192
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _ints(text: str, name: str) -> list[int]:
    """A comma list of positive ints (argparse type)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: {text!r} is not a comma list of ints") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{name}: {text!r}: give one or more ints >= 1")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{name}: {text!r} repeats a value")
    return values


def _positive(name: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {text!r} is not an int") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name}: {v}: must be >= 1")
        return v
    return parse


def wire_bytes(n: int, b: int, h: int, lanes: int, dtype: torch.dtype) -> int:
    """Bytes one rank sends to its N - 1 peers: (N - 1) slices of [B, H/N, lanes + P]."""
    e = torch.empty((), dtype=dtype).element_size()
    return (n - 1) * b * (h // n) * (lanes + dcp_a2a.lse_pack_dim(dtype)) * e


def local_bytes(n: int, b: int, h: int, lat: int, v: int, dtype: torch.dtype) -> dict:
    """Bytes each order moves through memory on one rank (dcp_a2a.up_projection's byte model;
    the LSE lanes counted)."""
    e = torch.empty((), dtype=dtype).element_size()
    p = dcp_a2a.lse_pack_dim(dtype)
    hpr = h // n
    first = h * lat * v + b * h * lat + 2 * b * h * v + 2 * b * h * (v + p) + b * hpr * v
    merged = b * h * lat + 2 * b * h * (lat + p) + 2 * b * hpr * lat + hpr * lat * v + b * hpr * v
    return {"before_exchange": first * e, "after_merge": merged * e}


def _inputs(n, b, h, lat, v, dtype, device):
    g = torch.Generator().manual_seed(b)
    out = torch.randn(b, h, lat, generator=g).to(dtype).to(device)
    lse = (torch.randn(b, h, generator=g) * 4).to(device)
    w = (torch.randn(h, lat, v, generator=g) / math.sqrt(lat)).to(dtype).to(device)
    return out, lse, w


def local_work(n, b, h, lat, v, dtype, device, rank=0):
    """{order: callable} running one rank's local work of that order, on preallocated
    buffers (what lse_reduce stages), the exchange left out."""
    out, lse, w = _inputs(n, b, h, lat, v, dtype, device)
    p = dcp_a2a.lse_pack_dim(dtype)
    hpr = h // n
    projected = torch.empty(b, h, v, dtype=dtype, device=device)
    send_v = torch.empty(n, b, hpr, v + p, dtype=dtype, device=device)
    send_l = torch.empty(n, b, hpr, lat + p, dtype=dtype, device=device)
    latent = torch.empty(b, hpr, lat, dtype=dtype, device=device)
    result = torch.empty(b, hpr, v, dtype=dtype, device=device)
    own = w[rank * hpr:(rank + 1) * hpr]

    def before_exchange():
        project(out, w, projected)
        dcp_a2a.pack_send(projected, lse, send_v, n, hpr, v, p)
        dcp_a2a.unpack_combine(send_v, v, p, False, True, into=result)

    def after_merge():
        dcp_a2a.pack_send(out, lse, send_l, n, hpr, lat, p)
        dcp_a2a.unpack_combine(send_l, lat, p, False, True, into=latent)
        project(latent, own, result)

    return {"before_exchange": before_exchange, "after_merge": after_merge}


def _wall_us(fn, nbytes) -> tuple[float, str]:
    """Wall-clock microseconds of one call after an untimed one (the CPU smoke run)."""
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6, "wall"


def measure(args, device) -> list[dict]:
    from dcp_a2a.testing.timing import ratio_verdict, timed_rounds

    dtype = DTYPES[args.dtype]
    timer = None if device.type == "cuda" else _wall_us
    rows = []
    for n in args.world_sizes:
        for b in args.batches:
            variants = local_work(n, b, args.heads, args.latent, args.value, dtype, device)
            moved = local_bytes(n, b, args.heads, args.latent, args.value, dtype)
            med, times, method = timed_rounds(variants, max(moved.values()), args.rounds, timer)
            lo, hi, verdict = ratio_verdict(times["before_exchange"], times["after_merge"],
                                            target=1.0)
            rows.append({
                "N": n, "B": b,
                "before_exchange_us": med["before_exchange"],
                "after_merge_us": med["after_merge"],
                "ratio": med["before_exchange"] / med["after_merge"],
                "ratio_ci95": [lo, hi],
                "before_exchange_faster": {"met": "yes", "missed": "no"}.get(verdict,
                                                                            "undecided"),
                "rounds_us": times, "timing": method,
                "wire_bytes": {o: wire_bytes(n, b, args.heads, w, dtype) for o, w in
                               (("before_exchange", args.value),
                                ("after_merge", args.latent))},
                "local_bytes": moved,
            })
    return rows


def crossovers(rows: list[dict]) -> dict:
    """Per N: the smallest B from which projecting first was faster (median ratio < 1) at every
    larger B measured, None where it never was at the largest; and how sure (every such B's
    95 % interval below 1, or not)."""
    out = {}
    for n in sorted({r["N"] for r in rows}):
        mine = sorted((r for r in rows if r["N"] == n), key=lambda r: r["B"])
        at, sure = None, True
        for r in reversed(mine):
            if r["ratio"] >= 1:
                break
            at = r["B"]
        if at is not None:
            sure = all(r["before_exchange_faster"] == "yes" for r in mine if r["B"] >= at)
        out[str(n)] = {"min_tokens": at, "every_interval_below_1": sure if at else None}
    return out


def card(device) -> dict:
    """The card's name and compute capability ("M.m"; None on the CPU)."""
    if device.type != "cuda":
        return {"name": "cpu (Triton interpreter)", "capability": None}
    major, minor = torch.cuda.get_device_capability(device)
    return {"name": torch.cuda.get_device_name(device), "capability": f"{major}.{minor}"}


def write_switch(report: dict, data_file: Path) -> dict:
    """Store this card's crossovers in ``data_file`` (replacing its entry for the same card
    name and shape); returns the entry."""
    data = json.loads(data_file.read_text()) if data_file.is_file() else {"cards": []}
    shape = report["shape"]
    entry = {"name": report["card"]["name"], "capability": report["card"]["capability"],
             "shape": shape,
             "min_tokens": {n: c["min_tokens"] for n, c in report["crossover"].items()},
             "source": "benchmarks/benchmark_up_projection.py: the local work on one GPU "
                       "(the wire left out)",
             "commit": report["run"]["commit"], "date": report["run"]["date"]}
    cards = [c for c in data.get("cards", [])
             if not (c.get("name") == entry["name"] and c.get("shape") == shape)]
    data["cards"] = cards + [entry]
    data_file.write_text(json.dumps(data, indent=2) + "\n")
    return entry


def table(report: dict) -> str:
    lines = [f"{report['card']['name']}  H={report['shape']['heads']} "
             f"L={report['shape']['latent']} V={report['shape']['value']} "
             f"{report['shape']['dtype']}  ({report['rows'][0]['timing'] if report['rows'] else ''})",
             f"{'N':>3} {'B':>6} {'proj-first us':>14} {'merge-first us':>15} {'ratio':>7} "
             f"{'95% interval':>17} {'faster?':>9} {'wire kB pf':>11} {'wire kB mf':>11}"]
    for r in report["rows"]:
        lo, hi = r["ratio_ci95"]
        lines.append(f"{r['N']:3d} {r['B']:6d} {r['before_exchange_us']:14.1f} "
                     f"{r['after_merge_us']:15.1f} {r['ratio']:7.3f} "
                     f"{f'[{lo:.3f}, {hi:.3f}]':>17} {r['before_exchange_faster']:>9} "
                     f"{r['wire_bytes']['before_exchange'] / 1e3:11.1f} "
                     f"{r['wire_bytes']['after_merge'] / 1e3:11.1f}")
    for n, c in report["crossover"].items():
        model = report["byte_model_switch"][n]
        lines.append(f"N={n}: project first from B={c['min_tokens']} "
                     f"(every interval below 1: {c['every_interval_below_1']}); "
                     f"byte model: {model}")
    return "\n".join(lines)


def distributed(args) -> int:
    """lse_reduce with and without the up-projection on the real group (run under torchrun)."""
    import torch.distributed as dist

    from dcp_a2a.testing.bench_collective import _time_collective
    from dcp_a2a.testing.devices import auto_backend, rank_device

    backend = auto_backend()
    device = rank_device(backend, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, **({"device_id": device} if backend == "nccl" else {}))
    rank, n = dist.get_rank(), dist.get_world_size()
    group = dcp_a2a.Group.from_process_group()
    dtype = DTYPES[args.dtype]
    if args.heads % n:
        if rank == 0:
            print(f"--heads {args.heads} is not divisible by the {n} ranks", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    rows = []
    for b in args.batches:
        out, lse, w = _inputs(n, b, args.heads, args.latent, args.value, dtype, device)
        calls = {"latent merge only": lambda: dcp_a2a.lse_reduce(out, lse, group),
                 **{f"w_uv {o}": (lambda o=o: dcp_a2a.lse_reduce(out, lse, group, w_uv=w,
                                                                 up_proj=o))
                    for o in ("before_exchange", "after_merge", "auto")}}
        res = {k: _time_collective(fn, device, args.iters) for k, fn in calls.items()}
        rows.append({"B": b, **{f"{k} us": v[0] for k, v in res.items()},
                     "timing": next(iter(res.values()))[1]})
    if rank == 0:
        with _run.recorded(args.out, "up_projection_ranks") as save:
            save({"card": card(device), "world_size": n,
                  "shape": {"heads": args.heads, "latent": args.latent, "value": args.value,
                            "dtype": args.dtype}, "rows": rows})
            keys = [k for k in rows[0] if k.endswith(" us")]
            print(f"{'B':>6} " + " ".join(f"{k:>24}" for k in keys))
            for r in rows:
                print(f"{r['B']:6d} " + " ".join(f"{r[k]:24.1f}" for k in keys))
    dist.destroy_process_group()
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = _run.parser(__doc__, "benchmark_up_projection.py")
    _run.add_out(ap)
    ap.add_argument("--heads", type=_positive("--heads"), default=128)
    ap.add_argument("--latent", type=_positive("--latent"), default=512)
    ap.add_argument("--value", type=_positive("--value"), default=128)
    ap.add_argument("--world-sizes", type=lambda s: _ints(s, "--world-sizes"), default=[4, 8])
    ap.add_argument("--batches", type=lambda s: _ints(s, "--batches"), default=list(BATCHES))
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--rounds", type=_positive("--rounds"), default=5,
                    help="interleaved rounds per point (>= 2 for an interval)")
    ap.add_argument("--iters", type=_positive("--iters"), default=20,
                    help="--distributed: timed calls per point")
    ap.add_argument("--write", action="store_true",
                    help="store this card's crossovers in the switch-point data file")
    ap.add_argument("--data", type=Path, default=DATA_FILE,
                    help="the switch-point data file --write updates")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, tiny shapes, seconds: checks the script, not the card")
    ap.add_argument("--distributed", action="store_true",
                    help="lse_reduce over the real ranks (run under torchrun)")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.smoke:
        args.heads, args.latent, args.value = 4, 32, 8
        args.world_sizes, args.batches, args.rounds = [2], [1, 4], 2
    if args.distributed:
        return distributed(args)
    bad = [n for n in args.world_sizes if args.heads % n]
    if bad:
        ap.error(f"--heads {args.heads} is not divisible by the DCP sizes {bad}")
    if args.write and args.smoke:
        ap.error("--write stores a card's measured switch point: not from a --smoke run")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        ap.error("no CUDA device: the local work's times need a GPU (--smoke: the script's structure on the CPU)")
    dtype = DTYPES[args.dtype]
    with _run.recorded(args.out, "up_projection") as save:
        rows = measure(args, device)
        report = {
            "card": card(device),
            "shape": {"heads": args.heads, "latent": args.latent, "value": args.value,
                      "dtype": args.dtype},
            "rounds": args.rounds, "rows": rows, "crossover": crossovers(rows),
            "byte_model_switch": {str(n): byte_model_switch(args.heads, args.latent,
                                                            args.value, n)
                                  for n in args.world_sizes},
            "element_size": torch.empty((), dtype=dtype).element_size(),
            "run": _run.provenance(),
        }
        if args.write:
            report["written"] = write_switch(report, args.data)
        del report["run"]  # recorded adds it
        save(report)
        print(table(report))
        if args.write:
            print(f"switch points written to {args.data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
