"""``dcp-a2a bench --grid``: ours next to two baselines at every point of the decode grid, with
the ratios and a verdict per point.

The baselines: the straightforward design (:mod:`dcp_a2a.testing.straightforward`: one program
per (token, head) and a run-time loop over the ranks, the first kernel an engine writes; the
target's baseline) and, for the unpack, the engine-design baseline
(:mod:`dcp_a2a.testing.engine_design`: the design of the unpack-combine kernel vLLM main ships,
so that falling behind the engine shows). At each point the baselines, a same-bytes copy and
each table's kernel run in ``--rounds`` interleaved rounds, medians reported (at the launch
floor one timing moves by more than the 5 % a verdict there needs). Each table's kernel then
gets a verdict against ``--target`` x the straightforward kernel's time: "met", "missed" or
"undecided", from a 95 % confidence interval of its time over the straightforward kernel's,
round by round (:func:`.timing.ratio_verdict`); an op whose verdict is undecided is timed
again, up to ``--settle-rounds`` rounds in all, and decided on every round it has. The unpack
also gets a verdict against ``ENGINE_TARGET`` x the engine-design kernel's time, from the same
rounds.
"""

from __future__ import annotations

import json
import statistics

import torch
from tqdm import tqdm

from ..kernels import tuning
from ..ops import pack_send, unpack_combine
from .bench import _inputs
from .outpaths import make_parent
from .timing import ENGINE_TARGET, TARGET_RATIO, copy_bandwidth, ratio_verdict, timed_verdicts


# --------------------------------------------------------------------------- ours vs straightforward
GRID_B = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 8192)


GRID_HN = ((128, 8), (64, 4), (64, 8), (32, 4), (16, 2))


def grid_points(quick: bool = False):
    """(B, H, N, D, dtype) of the comparison grid: bf16 at D in {512, 128, 64, 80}; fp16 and
    fp32 at D in {128, 512}. ``quick``: B in {1, 128, 8192}, (H, N) in {(128, 8), (64, 4)}."""
    bs = (1, 128, 8192) if quick else GRID_B
    hns = GRID_HN[:2] if quick else GRID_HN
    for dt, ds in (("bfloat16", (512, 128, 64, 80)), ("float16", (128, 512)),
                   ("float32", (128, 512))):
        for d in ds:
            for h, n in hns:
                for b in bs:
                    yield b, h, n, d, dt


def grid_point(b, h, n, d, dtype_name, copy_gbps, tables=("table",), rounds=3,
               settle_rounds=0, target=TARGET_RATIO) -> dict:
    """Pack and unpack-combine, ours and the straightforward design's, on one shape; the
    straightforward result is checked against ours, and every table's pack against those
    bytes, before anything is timed. Per op, the straightforward kernel, a device copy of the
    same bytes and each table's kernel are timed in interleaved rounds (``timed_verdicts``:
    ``rounds``, up to ``settle_rounds`` where a verdict is undecided; ``{op}_rounds`` says how
    many, ``{op}_times_us`` holds them all). Medians are reported; ``{op}_spread`` is the
    largest max / min over rounds of any kernel; ``{op}_ratio_ci`` and ``{op}_verdict`` are
    ``ratio_verdict``'s against ``target``. A kernel whose rules two tables share is timed
    once."""
    from . import engine_design
    from . import straightforward as sf

    dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dtype_name)
    recv = torch.empty_like(send)
    sf.pack(out, lse, send)
    pack_send(out, lse, recv, n, hpr, d, p)
    if not torch.equal(send.view(torch.uint8), recv.view(torch.uint8)):
        raise AssertionError(f"straightforward pack differs from ours at {b}x{h}x{d} N={n}")
    ref = unpack_combine(recv, d, p, False, True).float()
    for name, base in (("straightforward", sf.unpack_combine),
                       ("engine-design", engine_design.unpack_combine)):
        if not torch.allclose(base(recv, d).float(), ref, rtol=2 ** -6, atol=2 ** -6):
            raise AssertionError(f"{name} unpack differs from ours at {b}x{h}x{d} N={n}")
    wire = n * b * hpr * (d + p) * es
    pack_bytes = b * h * d * es + b * h * 4 + wire
    unpack_bytes = wire + b * hpr * d * es
    row = {"B": b, "H": h, "N": n, "D": d, "dtype": dtype_name, "rounds": rounds,
           "target": target, "tables": {}}
    ops = (("pack", lambda: pack_send(out, lse, send, n, hpr, d, p),
            lambda: sf.pack(out, lse, send), pack_bytes),
           ("unpack", lambda: unpack_combine(recv, d, p, False, True),
            lambda: sf.unpack_combine(recv, d), unpack_bytes))

    def under(name, fn):
        def run():
            tuning.ACTIVE = tuning.CANDIDATES[name]
            try:
                fn()
            finally:
                tuning.ACTIVE = tuning.TABLE
        return run

    for name in tables:  # every table's pack writes the bytes checked above
        send.view(torch.uint8).fill_(0xFF)
        under(name, ops[0][1])()
        if not torch.equal(send.view(torch.uint8), recv.view(torch.uint8)):
            raise AssertionError(f"table {name}: pack differs at {b}x{h}x{d} N={n}")

    for op, ours, base, nbytes in ops:
        # the floor for any kernel moving these bytes: a device copy of as many, timed alike
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        variants = {"sf": base, "copy": lambda src=src, dst=dst: dst.copy_(src)}
        if op == "unpack":  # the engine-design baseline, timed in the same rounds
            variants["engine"] = lambda: engine_design.unpack_combine(recv, d)
        rules_of = {name: tuning.CANDIDATES[name]["pack" if op == "pack" else "combine"]
                    for name in tables}
        timed_as = {}  # rules -> the first table that has them (its kernel is timed)
        for name in tables:
            if timed_as.setdefault(rules_of[name], name) == name:
                variants["table:" + name] = under(name, ours)
        judged = [k for k in variants if k.startswith("table:")]
        med, times, row[f"{op}_timing"], verdicts = timed_verdicts(
            variants, nbytes, judged, rounds, settle_rounds, target)
        del src, dst, variants
        row[f"{op}_rounds"], row[f"{op}_times_us"] = len(times["sf"]), times
        row[f"{op}_straightforward_us"], row[f"{op}_copy_us"] = med["sf"], med["copy"]
        row[f"{op}_spread"] = max(max(v) / min(v) for v in times.values())
        for name in reversed(tables):  # the first table last: its rows are the headline numbers
            timed = "table:" + timed_as[rules_of[name]]
            us, (lo, hi, verdict) = med[timed], verdicts[timed]
            row["tables"].setdefault(name, {}).update(
                {f"{op}_us": us, f"{op}_ratio_ci": [lo, hi], f"{op}_verdict": verdict})
            row[f"{op}_us"], row[f"{op}_ratio_ci"], row[f"{op}_verdict"] = us, [lo, hi], verdict
            row[f"{op}_ratio"] = us / row[f"{op}_straightforward_us"]
            row[f"{op}_pct_copy"] = 100 * nbytes / (us * 1e-6) / 1e9 / copy_gbps
        if "engine" in times:  # the first table's kernel against the engine design
            ours_rounds = times["table:" + timed_as[rules_of[tables[0]]]]
            lo, hi, verdict = ratio_verdict(ours_rounds, times["engine"], ENGINE_TARGET)
            row[f"{op}_engine_us"] = med["engine"]
            row[f"{op}_engine_ratio"] = row[f"{op}_us"] / med["engine"]
            row[f"{op}_engine_round_ratio"] = statistics.median(
                a / e for a, e in zip(ours_rounds, times["engine"]))
            row[f"{op}_engine_ratio_ci"], row[f"{op}_engine_verdict"] = [lo, hi], verdict
    return row


_MARK = {"met": "ok", "undecided": "?", "missed": "MISS"}


def grid_table(rows: list[dict]) -> str:
    # "copy us": a device copy of the same bytes (the floor for any kernel that moves them);
    # "v": the verdict against the target (ok, ? undecided, MISS)
    head = (f"{'B':>5} {'H':>4} {'N':>2} {'D':>4} {'dtype':<8} | {'pack us':>8} {'sf us':>8} "
            f"{'copy us':>8} {'ratio':>6} {'v':>4} {'%copy':>6} | {'unpack us':>9} {'sf us':>8} "
            f"{'copy us':>8} {'ratio':>6} {'v':>4} {'%copy':>6}")
    # "eng us", "/eng": the engine-design unpack and ours over it (rows timed before it was in
    # the grid leave them blank)
    engine = any("unpack_engine_us" in r for r in rows)
    if engine:
        head += f" | {'eng us':>8} {'/eng':>6} {'v':>4}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r['B']:>5} {r['H']:>4} {r['N']:>2} {r['D']:>4} {r['dtype']:<8} | "
            f"{r['pack_us']:>8.2f} {r['pack_straightforward_us']:>8.2f} "
            f"{r['pack_copy_us']:>8.2f} {r['pack_ratio']:>6.3f} "
            f"{_MARK[r['pack_verdict']]:>4} {r['pack_pct_copy']:>6.1f} | {r['unpack_us']:>9.2f} "
            f"{r['unpack_straightforward_us']:>8.2f} "
            f"{r['unpack_copy_us']:>8.2f} {r['unpack_ratio']:>6.3f} "
            f"{_MARK[r['unpack_verdict']]:>4} {r['unpack_pct_copy']:>6.1f}")
        if engine and "unpack_engine_us" in r:
            line += (f" | {r['unpack_engine_us']:>8.2f} {r['unpack_engine_ratio']:>6.3f} "
                     f"{_MARK[r['unpack_engine_verdict']]:>4}")
        lines.append(line)
    worst = max(rows, key=lambda r: max(r["pack_ratio"], r["unpack_ratio"]))
    lines.append(f"worst ratio (ours / straightforward): pack {max(r['pack_ratio'] for r in rows):.3f}"
                 f", unpack {max(r['unpack_ratio'] for r in rows):.3f} (at B={worst['B']} "
                 f"H={worst['H']} N={worst['N']} D={worst['D']} {worst['dtype']})")
    spreads = sorted(r[f"{op}_spread"] for r in rows for op in ("pack", "unpack"))
    timed = [(r[f"{op}_rounds"], r["rounds"]) for r in rows for op in ("pack", "unpack")]
    settled = sum(got > asked for got, asked in timed)
    lines.append(f"medians of {rows[0]['rounds']} interleaved rounds ({settled} ops, undecided "
                 f"after them, timed again: up to {max(timed)[0]} rounds); a kernel's max / min "
                 f"over them: median {spreads[len(spreads) // 2]:.3f}, worst {spreads[-1]:.3f}")
    counts = {op: {v: sum(r[f"{op}_verdict"] == v for r in rows) for v in _MARK}
              for op in ("pack", "unpack")}
    lines.append(f"verdicts at {rows[0]['target']} x straightforward (95 % interval of the "
                 f"per-round ratio): " + "; ".join(
                     f"{op} " + ", ".join(f"{c[v]} {v}" for v in _MARK)
                     for op, c in counts.items()))
    judged = [r for r in rows if "unpack_engine_us" in r]
    if judged:
        worst = max(judged, key=lambda r: r["unpack_engine_ratio"])
        c = {v: sum(r["unpack_engine_verdict"] == v for r in judged) for v in _MARK}
        lines.append(
            f"unpack vs the engine design (at most {ENGINE_TARGET} x its time): "
            + ", ".join(f"{c[v]} {v}" for v in _MARK)
            + f"; worst ratio {worst['unpack_engine_ratio']:.3f} at B={worst['B']} "
            f"H={worst['H']} N={worst['N']} D={worst['D']} {worst['dtype']}")
    # Over the copy of the same bytes, timed in the same rounds: a target below 1 asks for a
    # kernel faster than the device's own copy of its bytes; on an H200 ours gets there only
    # where the bytes are about L2's size (docs/perf.md).
    lines.append("not met (verdict, op, point: ratio of medians [interval]; ours and the "
                 "target over the copy):")
    for r in rows:
        for op in ("pack", "unpack"):
            if r[f"{op}_verdict"] != "met":
                lo, hi = r[f"{op}_ratio_ci"]
                copy = r[f"{op}_copy_us"]
                goal = r["target"] * r[f"{op}_straightforward_us"] / copy
                lines.append(f"  {r[f'{op}_verdict']:>9} {op:<6} B={r['B']} H={r['H']} "
                             f"N={r['N']} D={r['D']} {r['dtype']}: {r[f'{op}_ratio']:.3f} "
                             f"[{lo:.3f}, {hi:.3f}] over {r[f'{op}_rounds']} rounds; "
                             f"copy x {r[f'{op}_us'] / copy:.3f}, target copy x {goal:.3f}"
                             + (" (below the copy)" if goal < 1 else ""))
    return "\n".join(lines)


def grid_main(args) -> int:
    copy_gbps = copy_bandwidth()
    rows = []
    tables = args.tables or ["table"]
    props = torch.cuda.get_device_properties(0)
    import triton

    for point in tqdm(list(grid_points(args.quick)), desc="grid", mininterval=10):
        rows.append(grid_point(*point, copy_gbps, tables, args.rounds, args.settle_rounds,
                               args.target))
        # rewritten after every point: a run cut short still leaves what it measured
        with open(make_parent(args.out), "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__,
                       "triton": triton.__version__, "copy_gbps": copy_gbps,
                       "tables": tables, "grid": rows}, f, indent=1)
    print(f"device {props.name}; copy bandwidth {copy_gbps:.0f} GB/s (read + write)")
    print(grid_table(rows))
    return 0

