"""Derive a card's launch table from a sweep on that card: ``dcp-a2a tune``
(the old path ``python -m dcp_a2a.testing.tune`` runs the same program).

    dcp-a2a tune [--out DIR|FILE] [--base default.json] [--rounds 7]
        [--screen-rounds 3] [--finalists 3] [--confidence 0.95] [--budget 420]
    dcp-a2a tune --smoke --out DIR (the CPU: structure only)

At each row of ``SWEEP_ROWS`` (the 17 decode rows vLLM's kernel is compared at, and the
large-batch rows B=8192 H=64 D=512 bf16 N=4 and 8), for the pack and the unpack-combine, the
launch the base table gives (``--base``: by default the table of a card without one of its own)
is timed beside candidate launches (heads a program, warps, loads in the stores' layout, the
pack's slab kernel where it fits, a head-major grid, a head split over 2 or 4 programs): every
candidate's result is first checked bit for bit against the table's. Then, in CUDA-graph
replay (``dcp_a2a.testing.timing.timed_rounds``):

1. screening: ``--screen-rounds`` interleaved rounds of every candidate with a short warm-up;
   the ``--finalists`` with the lowest median per-round ratio over the table's launch (below 1)
   go on;
2. decision: ``--rounds`` fresh interleaved rounds of the table's launch and the finalists; a
   finalist replaces the current choice (first the table's launch) only when the
   ``--confidence`` interval of its per-round ratio over the current choice lies below 1
   (``timing.ratio_verdict``), finalists taken fastest first. Rows that make one problem of the
   table (float16 and bfloat16 at the same shape: the same lanes) are decided on their rounds
   together.

The card's table (``launch_tables/<device name>.json``, ``tuning.card_file_name``) is the base's
rules with, in front, one rule for each problem whose choice changed, taking exactly that
problem (``tuning.exact_rule``); elsewhere the base's rules decide. It records the card, the
commit, the date and, per problem, the launches and every round's times behind the choice, and
is read back (checked) before the summary prints. A process on that card takes it at its first
compiled launch; ``DCP_A2A_LAUNCH_TABLE=FILE`` tries a table anywhere. Problems not started
within ``--budget`` seconds are left out (and listed). About 4-5 minutes on one H100 (an
estimate from the earlier probes' timings: ~0.25 s a compile, ~15 ms a screening timing, ~35 ms
a deciding one, 0.25 s an event-timed one of the B=8192 packs; about 400 kernels to compile and
1000 launches to screen). The summary also counts the launches the bit-for-bit test of every
launch would run with the new table (each new one a kernel the gpu-check compiles).

``--smoke`` runs two tiny rows on the CPU through Triton's interpreter with the wall clock,
two candidates a kernel and two rounds: every step and the file, in seconds; the times mean
nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

SUMMARY = "derive this card's launch table from a sweep on it (a GPU; --smoke: any machine)"

# (B, H, D, N, dtype): the decode rows of the comparison with vLLM's kernel
DECODE_ROWS = [
    (1, 128, 512, 8, "bfloat16"), (16, 128, 512, 8, "bfloat16"), (32, 128, 512, 8, "bfloat16"),
    (64, 128, 512, 8, "bfloat16"), (128, 128, 512, 8, "bfloat16"),
    (256, 128, 512, 8, "bfloat16"), (512, 128, 512, 8, "bfloat16"),
    (64, 64, 512, 4, "bfloat16"), (128, 64, 512, 4, "bfloat16"),
    (64, 32, 128, 4, "float16"), (64, 32, 128, 4, "float32"), (64, 32, 128, 4, "bfloat16"),
    (256, 32, 128, 4, "float16"), (256, 32, 128, 4, "float32"), (256, 32, 128, 4, "bfloat16"),
    (128, 16, 128, 2, "bfloat16"), (128, 32, 64, 4, "bfloat16"),
]
# the large batches whose target is a share of the copy bandwidth
COPY_ROWS = [(8192, 64, 512, 4, "bfloat16"), (8192, 64, 512, 8, "bfloat16")]
SWEEP_ROWS = DECODE_ROWS + COPY_ROWS
# two rows of one problem (16-bit words: float16 and bfloat16 alike), so grouping runs too
SMOKE_ROWS = [(1, 2, 8, 2, "float16"), (1, 2, 8, 2, "bfloat16")]
KINDS = ("pack", "combine")
LARGE_ROWS = 16384  # problems of more rows (B x heads) get the large-batch candidates
SCREEN_WARMUP_MS = 5.0  # the screening's warm-up (the decision's: the bench's WARMUP_MS)
WIDE = 1 << 30  # a candidate's block_d: the launch caps it at the head's power of two


@dataclass(frozen=True)
class Problem:
    """One kind's launch problem, as ``tuning.launch`` sees it."""

    kind: str
    batch: int
    heads: int
    lanes: int
    ranks: int
    slab_ok: bool = False

    def args(self) -> tuple:
        return self.kind, self.batch, self.heads, self.lanes, self.ranks, self.slab_ok


def launch_name(cfg) -> str:
    """A launch in a few words: ``row h2 w4 lane``, ``slab h8 w4``, ``split2 w2``, ``+hm``."""
    if cfg.split_d > 1:
        name = f"split{cfg.split_d} h{cfg.block_h} w{cfg.num_warps}"
    else:
        name = f"{'slab' if cfg.slab else 'row'} h{cfg.block_h} w{cfg.num_warps}"
    return (name + (f" d{cfg.block_d}" if not cfg.slab and cfg.split_d == 1 else "")
            + " lane" * cfg.lane_loads + " hm" * cfg.head_major + " cs" * cfg.stream)


def candidate_specs(p: Problem):
    """The launches a sweep tries at ``p``, as overrides ask for them (``tuning.Launch``)."""
    from ..kernels.tuning import Launch

    large = p.batch * p.heads > LARGE_ROWS
    if p.kind == "pack":
        heads, warps = ((8, 16), (8, 16)) if large else ((1, 2, 4, 8), (1, 2, 4, 8))
        for h in heads:
            for w in warps:
                for lane in ((False,) if large else (False, True)):
                    yield Launch(h, WIDE, w, lane_loads=lane)
        if p.slab_ok:
            for g in (4, 8, 16):
                for w in ((4, 8, 16) if large else (1, 2, 4, 8)):
                    yield Launch(g, WIDE, w, slab=True)
        return
    heads, warps = ((4, 8, 16), (4, 8, 16)) if large else ((1, 2, 4), (1, 2, 4, 8))
    for h in heads:
        if h <= 2 or p.lanes <= 128 or large:
            for w in warps:
                yield Launch(h, WIDE, w)
    if not large:
        for h in (1, 2):
            for w in (1, 2, 4):
                yield Launch(h, WIDE, w, head_major=True)
        for split, ws in ((2, (1, 2, 4)), (4, (1, 2))):
            if p.lanes // split >= 32:
                for w in ws:
                    yield Launch(1, 0, w, split_d=split)


def override_spec(cfg, lanes: int):
    """An override that gives the launch ``cfg`` again: a split launch names its tiles' count
    (``Launch.split_d`` counts the programs that cover the head)."""
    from ..kernels._host import next_pow2

    return replace(cfg, split_d=next_pow2(lanes) // cfg.block_d) if cfg.split_d > 1 else cfg


def resolved(p: Problem, spec):
    """The launch ``tuning.launch`` gives ``p`` under the override ``spec``."""
    from ..kernels import tuning

    saved = tuning.OVERRIDES.get(p.kind)
    tuning.OVERRIDES[p.kind] = spec
    try:
        return tuning.launch(*p.args())
    finally:
        if saved is None:
            tuning.OVERRIDES.pop(p.kind, None)
        else:
            tuning.OVERRIDES[p.kind] = saved


def under(kind: str, spec, fn):
    """``fn`` under the launch override ``spec`` for ``kind`` (the callable's ``spec``)."""
    from ..kernels import tuning

    def run():
        tuning.OVERRIDES[kind] = spec
        try:
            return fn()
        finally:
            tuning.OVERRIDES.pop(kind, None)
    run.spec = spec
    return run


def wall_timer(fn, nbytes):
    """The smoke run's stand-in for ``bench.time_us`` (no CUDA graphs on a CPU)."""
    import torch

    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6, "wall"


class Row:
    """One sweep row's inputs on ``device`` and its two problems."""

    def __init__(self, row, device):
        import dcp_a2a
        from ..kernels import pack as pack_mod
        from . import eager

        self.row = tuple(row)
        b, h, d, n, dt = row
        self.p, self.hpr, self.out, self.lse, self.send, self.recv = eager.inputs(
            b, h, d, n, dt, device, seed=b * 7 + h + d)
        src, lanes, lanes_p, _ = pack_mod.lanes_of(self.out, self.p)
        slab_ok = pack_mod.slab_fits(src, lanes, lanes_p, self.hpr)
        self.problems = {"pack": Problem("pack", b, h, lanes, n, slab_ok),
                         "combine": Problem("combine", b, self.hpr, lanes, n)}
        es = self.out.element_size()
        wire = self.send.numel() * es
        self.bytes = {"pack": self.out.numel() * es + self.lse.numel() * 4 + wire,
                      "combine": wire + b * self.hpr * d * es}
        d_, p_, hpr, send, recv = d, self.p, self.hpr, self.send, self.recv
        out, lse = self.out, self.lse
        self.ops = {"pack": lambda: dcp_a2a.pack_send(out, lse, send, n, hpr, d_, p_),
                    "combine": lambda: dcp_a2a.unpack_combine(recv, d_, p_, False, True)}

    def result(self, kind, fn):
        """What ``fn`` (this row's ``kind`` op, under some launch) writes: the pack's wire bytes
        (the buffer poisoned first), the combine's output."""
        import torch

        if kind == "pack":
            self.send.view(torch.uint8).fill_(0xFF)
            fn()
            return self.send.clone()
        return fn()


def _same_bits(a, b) -> bool:
    import torch

    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


def variants(row: Row, kind: str, base_rules, limit: int | None = None):
    """({name: callable}, {name: launch}) at ``row`` for ``kind``: "table" (the base table's
    launch) and each distinct candidate (at most ``limit``), every one checked bit for bit
    against the table's result."""
    from ..kernels import tuning

    p = row.problems[kind]
    table = tuning._compiled(tuning.first_launch(base_rules[kind], p.batch, p.heads, p.lanes,
                                                 p.ranks, p.slab_ok), p.batch)
    spec = override_spec(table, p.lanes)
    if resolved(p, spec) != table:
        raise AssertionError(f"the override {spec} does not give the table's launch {table} "
                             f"at {p}")
    launches, specs = {"table": table}, {"table": spec}
    for cand in candidate_specs(p):
        cfg = resolved(p, cand)
        if cfg not in launches.values():
            launches[launch_name(cfg)] = cfg
            specs[launch_name(cfg)] = cand
        if limit is not None and len(launches) > limit:
            break
    fns = {name: under(kind, s, row.ops[kind]) for name, s in specs.items()}
    ref = row.result(kind, fns["table"])
    for name, fn in fns.items():
        if not _same_bits(row.result(kind, fn), ref):
            raise AssertionError(f"{kind} under {launches[name]} gives other bits than the "
                                 f"table's launch {table} at B, H, D, N, dtype = {row.row}: "
                                 "every launch must give the same bits")
    return fns, launches


def _ratios(times, a, b):
    return [x / y for x, y in zip(times[a], times[b])]


def decide(rows_times, finalists, confidence):
    """(chosen name, its interval over the table's launch, the steps taken): finalists fastest
    first; one replaces the current choice when the ``confidence`` interval of its per-round
    ratio over the current choice, every row of the group's rounds together, lies below 1."""
    from .timing import ratio_verdict

    def pooled(a, b):
        xs = [t for times in rows_times for t in times[a]]
        ys = [t for times in rows_times for t in times[b]]
        return xs, ys

    def median_ratio(a, b):
        return statistics.median(r for times in rows_times for r in _ratios(times, a, b))

    current, steps = "table", []
    for name in sorted(finalists, key=lambda k: median_ratio(k, "table")):
        lo, hi, _ = ratio_verdict(*pooled(name, current), 1.0, confidence)
        won = hi < 1.0
        steps.append({"candidate": name, "over": current, "median_ratio": median_ratio(
            name, current), "interval": [lo, hi], "replaces": won})
        if won:
            current = name
    lo, hi, _ = ratio_verdict(*pooled(current, "table"), 1.0, confidence)
    return current, [lo, hi], steps


def sweep(rows, device, base_rules, *, rounds, screen_rounds, finalists, confidence, budget,
          screen_timer, timer, limit=None, log=print):
    """(every problem's choice: a dict a problem of each kind of ``KINDS``, the problems left
    out past ``budget`` seconds). A problem is checked (every candidate compiled and its bits
    compared), screened and decided before the next one starts."""
    from .timing import timed_rounds

    t0, made, skipped = time.time(), [], []
    groups: dict = {}  # Problem -> [Row]: rows the table cannot tell apart
    for r in rows:
        row = Row(r, device)
        for kind in KINDS:
            groups.setdefault(row.problems[kind], []).append(row)
    for p, members in groups.items():
        if time.time() - t0 > budget:
            skipped.append({"kind": p.kind, "rows": [list(m.row) for m in members]})
            continue
        checked = [variants(row, p.kind, base_rules, limit) for row in members]
        names = [n for n in checked[0][1] if all(n in c[1] for c in checked)]
        screen = [timed_rounds({n: fns[n] for n in names}, row.bytes[p.kind], screen_rounds,
                               screen_timer)[1] for row, (fns, _) in zip(members, checked)]
        medians = {n: statistics.median(r for t in screen for r in _ratios(t, n, "table"))
                   for n in names if n != "table"}
        best = sorted((n for n, m in medians.items() if m < 1.0), key=medians.get)[:finalists]
        final, method = [], None
        for row, (fns, _) in zip(members, checked):
            _, times, method = timed_rounds({n: fns[n] for n in ["table"] + best},
                                            row.bytes[p.kind], rounds, timer)
            final.append(times)
        if best:
            chosen, interval, steps = decide(final, best, confidence)
        else:
            chosen, interval, steps = "table", [1.0, 1.0], []
        launches = checked[0][1]
        made.append({
            "kind": p.kind, "rows": [list(m.row) for m in members],
            "problem": {"batch": p.batch, "heads": p.heads, "head_lanes": p.lanes,
                        "ranks": p.ranks, "slab_ok": p.slab_ok},
            "table_launch": launch_name(launches["table"]),
            "chosen": None if chosen == "table" else chosen,
            "launch": asdict(launches[chosen]),
            "over_table": statistics.median(r for t in final
                                            for r in _ratios(t, chosen, "table")),
            "interval": interval, "steps": steps, "timing": method,
            "candidates": len(names) - 1, "screen_median_over_table": medians,
            "screen_times_us": screen, "times_us": final})
        c = made[-1]
        log(f"  {p.kind:8} {' '.join(map(str, c['rows'][0])):28} {c['table_launch']:22} -> "
            f"{c['chosen'] or '(kept)'} {c['over_table']:.3f} of {c['candidates']} candidates "
            f"({time.time() - t0:.0f} s)")
    return made, skipped


def _bounds(rule) -> tuple:
    """What decides which problems a rule takes."""
    return (rule.max_rows, rule.min_rows, rule.min_head_lanes, rule.max_head_lanes,
            rule.min_ranks, rule.max_ranks, rule.min_lanes)


def derive_table(base, choices, card, provenance) -> dict:
    """The JSON document of the card's table: the base's rules with an exact rule in front for
    each problem whose choice changed (a base rule of the very same bounds, an earlier sweep's,
    left out: it could no longer take a problem)."""
    from ..kernels import tuning

    rules = {k: [] for k in tuning.KINDS}
    seen, shadowed = set(), set()
    for c in choices:
        if c["chosen"] is None:
            continue
        p = c["problem"]
        cfg = tuning.Launch(**c["launch"])
        why = (f"sweep at {', '.join(' '.join(map(str, r)) for r in c['rows'])} (B H D N "
               f"dtype): {c['chosen']} {c['over_table']:.3f} [{c['interval'][0]:.3f}, "
               f"{c['interval'][1]:.3f}] x the base table's {c['table_launch']}")
        rule = tuning.exact_rule(c["kind"], cfg, p["batch"], p["heads"], p["head_lanes"],
                                 p["ranks"], p["slab_ok"])
        key = (c["kind"],) + _bounds(rule)
        if key in seen:  # two problems of one rule's bounds: the first swept decides
            continue
        seen.add(key)
        if not rule.slab:  # a slab rule may decline (slab_ok): the base's then decides
            shadowed.add(key)
        rules[c["kind"]].append(tuning.rule_to_json(rule, why))
    for kind in tuning.KINDS:  # less a base rule a new one shadows (an earlier sweep's)
        rules[kind] += [tuning.rule_to_json(r) for r in base.rules[kind]
                        if (kind,) + _bounds(r) not in shadowed]
    changed = sum(c["chosen"] is not None for c in choices)
    doc = {"format": tuning.TABLE_FORMAT, "card": card,
           "about": (f"Derived by dcp-a2a tune on one {card['name']} "
                     f"({provenance['date'][:10]}, commit {provenance['commit']}): the rules of "
                     f"{' -> '.join(_chain(base.path))} with, in front, an exact rule for each "
                     f"of the {changed} swept problems (of {len(choices)}) where a launch beat "
                     f"the base table's ({provenance['confidence']:.0%} interval of the "
                     "per-round ratio below 1)."),
           "rules": rules}
    notes = _notes(base.path)
    if notes:
        doc["notes"] = notes
    doc["sweep"] = {**provenance, "base": base.name, "choices": choices}
    return doc


def _chain(path: Path) -> list[str]:
    """The table file at ``path`` and the bases it takes rules from, by name."""
    doc = json.loads(path.read_text())
    return [path.name] + (_chain(path.parent / doc["base"]) if doc.get("base") else [])


def _notes(path: Path):
    """The notes of the table in ``path``, or of its base where it has none."""
    doc = json.loads(path.read_text())
    if doc.get("notes") or not doc.get("base"):
        return doc.get("notes")
    return _notes(path.parent / doc["base"])


def write_table(doc, out: Path) -> Path:
    """Write ``doc`` (one rule a line) where ``out`` says: a ``.json`` file, else a directory
    that gets the card's file."""
    from ..kernels import tuning

    if out.suffix != ".json":  # a directory, made where missing
        out.mkdir(parents=True, exist_ok=True)
        path = out / tuning.card_file_name(doc["card"]["name"])
    else:
        path = out
        path.parent.mkdir(parents=True, exist_ok=True)
    head = {k: v for k, v in doc.items() if k not in ("rules", "sweep")}
    lines = json.dumps(head, indent=2)[:-2].splitlines()
    lines[-1] += ","
    lines.append('  "rules": {')
    kinds = list(doc["rules"].items())
    for i, (kind, rules) in enumerate(kinds):
        lines.append(f'    "{kind}": [')
        lines += [f"      {json.dumps(r)}" + ("," if j < len(rules) - 1 else "")
                  for j, r in enumerate(rules)]
        lines.append("    ]" + ("," if i < len(kinds) - 1 else ""))
    lines.append("  },")
    lines.append('  "sweep": ' + json.dumps(doc["sweep"]))
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
    return path


def summary(choices, skipped, path, seconds, card, launches=None) -> str:
    head = (f"{'kind':8} {'rows (B H D N dtype)':40} {'table launch':24} {'chosen':24} "
            f"{'x table':>7} {'interval':>16}")
    lines = [head, "-" * len(head)]
    for c in choices:
        rows = "; ".join(" ".join(map(str, r)) for r in c["rows"])
        lo, hi = c["interval"]
        lines.append(f"{c['kind']:8} {rows:40} {c['table_launch']:24} "
                     f"{c['chosen'] or '(kept)':24} {c['over_table']:7.3f} "
                     f"[{lo:6.3f},{hi:6.3f}]")
    changed = sum(c["chosen"] is not None for c in choices)
    lines.append(f"{card['name']}: {changed} of {len(choices)} problems take another launch than "
                 f"the base table's; {seconds:.0f} s; {path}")
    for s in skipped:
        lines.append(f"left out past --budget: {s['kind']} at {s['rows']}")
    if launches:
        lines.append(f"the bit-for-bit test of every launch (accuracy job's GPU shapes): "
                     f"{launches[0]} launches with the shipped tables, {launches[1]} with this "
                     "one too (each new one a kernel to compile in the gpu-check)")
    return "\n".join(lines)


def invariance_launches(extra=None) -> int:
    """Launches the bit-for-bit test of every launch runs at the accuracy job's GPU shapes
    (``tuning.every_launch`` over N = 2, 4, 8 and each dtype, as
    tests/kernel/test_launch_invariance.py lists them), with the rules ``extra`` ({kind:
    rules}, a new table's) added: most are a kernel to compile, the gpu-check's main cost."""
    from ..kernels import tuning
    from .accuracy_cases import GPU_SHAPES, parse_shapes

    total = 0
    for s in parse_shapes(GPU_SHAPES):
        for n, dt in ((n, dt) for n in (2, 4, 8) for dt in ("float16", "bfloat16", "float32")):
            if s.dtype not in (None, dt) or s.h % n:
                continue
            paired = dt != "float32" and s.d % 2 == 0
            lanes = s.d // 2 if paired else s.d
            slab_ok = (dt == "float32" or paired) and lanes % 4 == 0 and (s.h // n) % 4 == 0
            for kind, heads, ranks, ok in (("pack", s.h, n, slab_ok),
                                           ("combine", s.h // n, n, False),
                                           ("scale", s.h, 1, False)):
                got = tuning.every_launch(kind, s.b, heads, lanes if kind != "scale" else s.d,
                                          ranks, ok)
                more = tuning.launches_of((extra or {}).get(kind, ()), s.b, heads,
                                          lanes if kind != "scale" else s.d, ranks, ok)
                total += len(got) + sum(c not in got for c in more)
    return total


def _commit() -> str:
    """The checkout's commit (``+dirty`` with changes), or "unknown" outside a git checkout."""
    if os.environ.get("DCP_A2A_COMMIT"):  # a copy of a checkout without its own history
        return os.environ["DCP_A2A_COMMIT"][:12]
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
                             capture_output=True, text=True, timeout=30, check=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha.strip() + ("+dirty" if dirty.strip() else "")


def _card(device):
    import os

    import torch

    if device == "cpu":
        return {"name": "CPU interpreter", "capability": [0, 0], "sms": os.cpu_count() or 1}
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": p.name, "capability": [p.major, p.minor], "sms": p.multi_processor_count}


def _table_out(value: str) -> Path:
    """A .json file, or a directory the card's file goes in (the shared output checks)."""
    from . import args as a

    return Path(a.out_file(value) if value.endswith(".json") else a.out_dir(value))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import args as a

    parser.add_argument("--out", type=_table_out, default=None, metavar="DIR|FILE",
                        help="a directory (the card's file goes in it) or a .json file; "
                             "default: the package's launch_tables/, where a process looks")
    parser.add_argument("--base", default="default.json",
                        help="the table whose launches are the ones to beat and whose rules the "
                             "card's table keeps (a file in launch_tables/, or a path)")
    parser.add_argument("--rounds", type=a.count(2), default=7,
                        help="interleaved rounds that decide (2 at least: an interval)")
    parser.add_argument("--screen-rounds", type=a.positive_int, default=3,
                        help="interleaved rounds that pick the finalists")
    parser.add_argument("--finalists", type=a.positive_int, default=3,
                        help="candidates a problem that go on to the deciding rounds")
    parser.add_argument("--confidence", default=0.95,
                        type=a.number(0, 1, lo_open=True, hi_open=True, what="confidence"),
                        help="a candidate wins where this interval of its ratio is below 1")
    parser.add_argument("--budget", type=a.seconds(), default=420.0,
                        help="seconds: a problem not started by then is left out")
    parser.add_argument("--smoke", action="store_true",
                        help="two tiny rows on the CPU (the interpreter, wall clock, two "
                             "candidates a kernel): the structure, in seconds")


def main(args) -> int:
    import torch

    from ..kernels import tuning
    from . import bench

    try:
        base = tuning.read_table(args.base)
    except tuning.TableError as e:
        print(f"dcp-a2a tune: --base: {e}", file=sys.stderr)
        return 2
    if args.smoke:
        if args.out is None:
            print("dcp-a2a tune --smoke writes the interpreter's table: give --out",
                  file=sys.stderr)
            return 2
        device = "cuda" if torch.cuda.is_available() else "cpu"
        rows, limit, timers = SMOKE_ROWS, 2, (wall_timer, wall_timer)
        rounds, screen, finalists = 2, 2, 1
    else:
        if not torch.cuda.is_available():
            print("dcp-a2a tune needs a CUDA GPU (--smoke: the CPU structure check)",
                  file=sys.stderr)
            return 3
        device, rows, limit = "cuda", SWEEP_ROWS, None

        def screen_timer(fn, nbytes):
            return bench.time_us(fn, nbytes, warmup_ms=SCREEN_WARMUP_MS)

        timers = (screen_timer, bench.time_us)
        rounds, screen, finalists = args.rounds, args.screen_rounds, args.finalists
    out = args.out if args.out is not None else tuning.TABLES_DIR
    t0 = time.time()
    choices, skipped = sweep(rows, device, base.rules, rounds=rounds, screen_rounds=screen,
                             finalists=finalists, confidence=args.confidence,
                             budget=args.budget, screen_timer=timers[0], timer=timers[1],
                             limit=limit, log=lambda s: print(s, file=sys.stderr, flush=True))
    import triton

    card = _card(device)
    provenance = {"card": card, "commit": _commit(),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds"),
                  "torch": torch.__version__, "triton": triton.__version__,
                  "cuda": torch.version.cuda, "smoke": bool(args.smoke), "rounds": rounds,
                  "screen_rounds": screen, "finalists": finalists,
                  "confidence": args.confidence, "seconds": round(time.time() - t0, 1),
                  "rows": [list(r) for r in rows], "skipped": skipped}
    doc = derive_table(base, choices, card, provenance)
    path = write_table(doc, out)
    table = tuning.read_table(path)  # as a process will read it: checked
    launches = None if args.smoke else (invariance_launches(), invariance_launches(table.rules))
    print(summary(choices, skipped, path, time.time() - t0, card, launches))
    return 0


if __name__ == "__main__":  # the old entry point: the same program as `dcp-a2a tune`
    from .cli import arguments

    raise SystemExit(main(arguments("tune")))
