"""Launch configurations of the kernels (block sizes, warps): a table per card, chosen per problem.

The tables are data: one JSON file per card in ``launch_tables/`` (``NVIDIA_H200.json``, named
after the device as torch reports it, as engines name their per-device kernel configs), and
``default.json`` for a card without one. A process takes its table once, at its first compiled
launch (``table_in_force``): the file named after the current device, else the one file whose
card has the device's compute capability and SM count, else the default;
``DCP_A2A_LAUNCH_TABLE`` (a file name in ``launch_tables/`` or a path) chooses instead. From then
on the table in force never changes, so a CUDA graph captured at one batch size replays the
launch it captured, and the eager path pays nothing for the choice: a problem's launch is looked
up as before. Every table is validated when it is read (:class:`TableError` names the file and
the rule); ``dcp-a2a tune`` derives a card's table from a sweep on that card.

The tests run every configuration any shipped table can pick (``every_launch``): the kernels'
results are bitwise the same under each of them (no FMA contraction, fixed summation order; see
:mod:`dcp_a2a.kernels.merge_math`), so which card's table a process took never changes a bit.
The benchmark (``dcp-a2a bench --sweep``) overrides the table through
``OVERRIDES`` to time variants in one run; docs/perf_history.md records what was tried and why
the H200's rules won. Triton's CPU interpreter keeps a table of its own (``INTERPRETER``).
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .. import _env
from ._host import next_pow2, prev_pow2


@dataclass(frozen=True)
class Launch:
    block_h: int  # heads a program (a power of two)
    block_d: int
    num_warps: int
    stream: bool = False  # streaming cache hints: evict-first loads, .cs stores
    block_b: int = 1  # tokens a program (a power of two; > 1 only in the interpreter, see below)
    slab: bool = False  # pack only: the slab kernel, BLOCK_H heads (4 | BLOCK_H | H/N) a chunk
    lane_loads: bool = False  # pack's row kernel: loads in the stores' layout (no shared memory)
    head_major: bool = False  # the grid's first axis walks heads (see ``grid``)
    # combine: programs a head, each one BLOCK_D tile of its lanes (split_d x block_d covers
    # the head; a grid's third axis): fewer registers a program, more programs
    split_d: int = 1

    def grid(self, batch: int, heads: int) -> tuple[int, ...]:
        """(token blocks, head blocks), or with ``head_major`` (head blocks, token blocks):
        programs are dispatched first axis first, so those running at once then read one
        token's heads (consecutive bytes), not one head of consecutive tokens (H x D apart).
        With ``split_d`` > 1, a third axis: the tile of the head."""
        tokens, head_blocks = -(-batch // self.block_b), -(-heads // self.block_h)
        grid = (head_blocks, tokens) if self.head_major else (tokens, head_blocks)
        return grid + (self.split_d,) if self.split_d > 1 else grid


@dataclass(frozen=True)
class Rule:
    """For problems of at most ``max_rows`` rows (token x head pairs the kernel walks): BLOCK_D
    is the head dim's power of two capped at ``block_d_cap`` lanes, and a program's BLOCK_H
    heads (at least one, at most the heads there are) fill ``lanes`` lanes; with
    ``span_tokens`` BLOCK_B tokens a program fill what one token's heads leave. With
    ``per_rank``, ``lanes`` counts the loads of all N ranks (the combine reads N lanes for each
    lane it writes): a program gets ``lanes / N`` output lanes, so its bytes in flight do not
    grow with N. ``one_peer_warps``: the warps of a program whose heads all go to one peer
    (BLOCK_H <= H/N; the pack then writes one contiguous slab of the wire); with it, a full
    program whose heads would straddle two peers (BLOCK_H = 2 H/N) takes one peer's H/N heads
    instead, at ``num_warps``.

    ``slab`` (pack only): the slab kernel (:mod:`dcp_a2a.kernels.pack`), for problems it fits
    (``slab_ok``): a program's heads fill ``lanes`` lanes, at least 4 and at most what divides
    a peer's H/N; ``slab_warps`` ((lanes, heads, warps), ...) gives the warps of the first entry
    whose lanes and heads the program reaches. A program of fewer than ``min_lanes`` lanes
    does not take the rule (the next rule of the table does).

    ``lane_loads`` (pack's row kernel): its loads are one lane a thread, in the layout of its
    wire stores, instead of 16-byte vectors that a shared-memory shuffle and a CTA barrier
    then hand to the stores' layout (a decode launch waits on that shuffle).
    ``head_major`` (pack): the grid's first axis walks heads (``Launch.grid``).

    A rule takes only problems of more than ``min_rows`` rows, and with ``min_head_lanes`` /
    ``max_head_lanes`` only heads of at least / at most that many lanes, with ``max_ranks``
    only groups of at most that many ranks (a combine thread's loads in flight are N x its
    lanes: fewer ranks, fewer bytes in flight a warp), with ``min_ranks`` only groups of at
    least that many.

    ``split_d`` (combine only): a head's lanes over ``split_d`` programs, each a tile of the
    head's power of two over ``split_d`` (as many programs as cover the head: ``Launch.split_d``
    counts them); ``lanes`` then counts a program's tiles' lanes."""

    max_rows: float
    block_d_cap: int
    lanes: int
    num_warps: int
    stream: bool = False
    span_tokens: bool = False
    per_rank: bool = False
    one_peer_warps: int = 0
    slab: bool = False
    slab_warps: tuple[tuple[int, int, int], ...] = ()
    min_lanes: int = 0
    lane_loads: bool = False
    min_head_lanes: int = 0
    max_head_lanes: int = 0
    head_major: bool = False
    min_rows: int = 0
    max_ranks: int = 0
    min_ranks: int = 0
    split_d: int = 1

    def launch(self, batch: int, heads: int, head_lanes: int, ranks: int = 1,
               slab_ok: bool = False, any_size: bool = False) -> Launch | None:
        """The launch, or None where this rule does not take the problem (a slab rule where
        the problem does not fit the slab kernel; unless ``any_size``, rows or head lanes out of
        the rule's bounds, a slab program below ``min_lanes``)."""
        if not any_size and ((self.min_rows and batch * heads <= self.min_rows)
                             or head_lanes < self.min_head_lanes
                             or (self.max_head_lanes and head_lanes > self.max_head_lanes)
                             or (self.max_ranks and ranks > self.max_ranks)
                             or ranks < self.min_ranks):
            return None
        block_d, split = min(next_pow2(head_lanes), self.block_d_cap), 1
        if self.split_d > 1:  # tiles of the head's power of two, as many as cover it
            block_d = max(1, next_pow2(head_lanes) // self.split_d)
            split = -(-head_lanes // block_d)
        lanes = self.lanes // ranks if self.per_rank else self.lanes
        rows = prev_pow2(max(1, lanes // block_d))
        if self.slab:
            if not slab_ok:
                return None
            g = slab_heads(rows, heads, ranks)
            if g * head_lanes < self.min_lanes and not any_size:
                return None
            warps = next(w for lanes_, heads_, w in self.slab_warps
                         if g * head_lanes >= lanes_ and g >= heads_)
            return Launch(g, block_d, warps, self.stream, slab=True, head_major=self.head_major)
        block_h = _fit(rows, heads)
        block_b = _fit(rows // block_h, batch) if self.span_tokens else 1
        warps = self.num_warps
        slab = heads // ranks  # heads a peer gets
        if self.one_peer_warps and block_h <= slab:
            warps = self.one_peer_warps
        elif self.one_peer_warps and block_h == 2 * slab and block_h * block_d == lanes:
            block_h = slab  # a full program that straddled two peers: one peer's slab instead
        return Launch(block_h, block_d, warps, self.stream, block_b,
                      lane_loads=self.lane_loads, head_major=self.head_major, split_d=split)




_ANY = float("inf")

# --------------------------------------------------------------------------- the tables' files
TABLES_DIR = Path(__file__).resolve().with_name("launch_tables")
DEFAULT_TABLE = "default.json"
TABLE_ENV = "DCP_A2A_LAUNCH_TABLE"  # a file name in TABLES_DIR, or a path: this table instead
TABLE_FORMAT = 1
KINDS = ("pack", "combine", "scale")
_KEYS = ("format", "card", "about", "base", "rules", "notes", "sweep")
_WARPS = (1, 2, 4, 8, 16, 32)
_RULE_FIELDS = {f.name: f for f in fields(Rule)}
_REQUIRED = ("max_rows", "block_d_cap", "lanes", "num_warps")
_BOOLS = ("stream", "span_tokens", "per_rank", "slab", "lane_loads", "head_major")
_COUNTS = ("min_lanes", "min_head_lanes", "max_head_lanes", "min_rows", "max_ranks", "min_ranks")
# the options only some kernels read (the others' launchers would ignore them or misplace
# their programs: the scale kernel knows no head-major grid)
_OPTION_KINDS = {"stream": ("pack", "combine"), "head_major": ("pack", "combine"),
                 "lane_loads": ("pack",), "slab": ("pack",), "slab_warps": ("pack",),
                 "min_lanes": ("pack",), "one_peer_warps": ("pack",), "split_d": ("combine",)}


class TableError(ValueError):
    """A launch table file that cannot be used, naming the file and what is wrong in it."""


@dataclass(frozen=True)
class Table:
    """A launch table as read from its file: ``rules`` by kind (the first rule of a kind that
    takes a problem gives its launch), the ``card`` it was tuned on (None: the default), and
    the sweep behind it (None where it was tuned by hand, pass by pass)."""

    name: str
    path: Path
    card: dict | None
    rules: dict = field(repr=False)
    about: str = ""
    sweep: dict | None = None


def card_file_name(device_name: str) -> str:
    """The file of a device's table: its name as torch reports it, runs of anything but
    letters and digits as one ``_`` ("NVIDIA H100 80GB HBM3" -> NVIDIA_H100_80GB_HBM3.json)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", device_name).strip("_") + ".json"


def _pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and v & (v - 1) == 0


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def rule_from_json(obj, kind: str) -> Rule:
    """The :class:`Rule` a table's JSON object describes; ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"a rule is a JSON object, not {type(obj).__name__}")
    unknown = sorted(set(obj) - set(_RULE_FIELDS) - {"why"})
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)} (a rule has: "
                         f"{', '.join(_RULE_FIELDS)}, and a free-text 'why')")
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    kw = {k: v for k, v in obj.items() if k != "why"}
    if "why" in obj and not isinstance(obj["why"], str):
        raise ValueError("'why' is free text (a string)")
    rows = kw["max_rows"]
    if rows == "any":
        kw["max_rows"] = _ANY
    elif not (_count(rows) and rows >= 1):
        raise ValueError(f"max_rows is a count of at least 1 or \"any\", not {rows!r}")
    if not _pow2(kw["block_d_cap"]) or kw["block_d_cap"] > 4096:
        raise ValueError(f"block_d_cap is a power of two up to 4096, not {kw['block_d_cap']!r}")
    if not (_count(kw["lanes"]) and kw["lanes"] >= 1):
        raise ValueError(f"lanes is a count of at least 1, not {kw['lanes']!r}")
    for k in ("num_warps",) + (("one_peer_warps",) if kw.get("one_peer_warps") else ()):
        if kw[k] not in _WARPS or isinstance(kw[k], bool):
            raise ValueError(f"{k} is one of {_WARPS}, not {kw[k]!r}")
    for k in _BOOLS:
        if k in kw and not isinstance(kw[k], bool):
            raise ValueError(f"{k} is true or false, not {kw[k]!r}")
    for k in _COUNTS + ("one_peer_warps",):
        if k in kw and not _count(kw[k]):
            raise ValueError(f"{k} is a count (0 or more), not {kw[k]!r}")
    if kw.get("min_rows", 0) and kw["min_rows"] >= kw["max_rows"]:
        raise ValueError(f"min_rows {kw['min_rows']} leaves no rows below max_rows "
                         f"{kw['max_rows']}")
    for lo, hi in (("min_head_lanes", "max_head_lanes"), ("min_ranks", "max_ranks")):
        if kw.get(lo, 0) and kw.get(hi, 0) and kw[lo] > kw[hi]:
            raise ValueError(f"{lo} {kw[lo]} is above {hi} {kw[hi]}: no problem fits")
    if "split_d" in kw and not _pow2(kw["split_d"]):
        raise ValueError(f"split_d is a power of two, not {kw['split_d']!r}")
    for k, kinds in _OPTION_KINDS.items():
        if kw.get(k) and kw[k] != _RULE_FIELDS[k].default and kind not in kinds:
            raise ValueError(f"{k} is an option of the {' and '.join(kinds)} kernel(s) only, "
                             f"not of the {kind} kernel")
    if kw.get("slab"):
        entries = kw.get("slab_warps")
        if not isinstance(entries, list) or not entries:
            raise ValueError("a slab rule needs slab_warps: [[lanes, heads, warps], ...]")
        for e in entries:
            if not (isinstance(e, list) and len(e) == 3 and all(_count(x) for x in e)
                    and e[2] in _WARPS):
                raise ValueError(f"slab_warps entries are [lanes, heads, warps] (warps one of "
                                 f"{_WARPS}), not {e!r}")
        if entries[-1][:2] != [0, 0]:
            raise ValueError("slab_warps must end in [0, 0, warps] (it then gives every "
                             "program its warps)")
        kw["slab_warps"] = tuple(tuple(e) for e in entries)
    elif kw.get("slab_warps"):
        raise ValueError("slab_warps without slab: true")
    return Rule(**kw)


def rule_to_json(rule: Rule, why: str | None = None) -> dict:
    """``rule`` as a table's JSON object (the fields that differ from their defaults)."""
    out = {}
    for name, f in _RULE_FIELDS.items():
        v = getattr(rule, name)
        if name in _REQUIRED or v != f.default:
            if name == "max_rows":
                v = "any" if v == _ANY else int(v)
            elif name == "slab_warps":
                v = [list(e) for e in v]
            out[name] = v
    if why:
        out["why"] = why
    return out


def _takes_every_problem(rule: Rule) -> bool:
    """Whether ``rule`` gives a launch for any problem (a kind's last rule must)."""
    return (rule.max_rows == _ANY and not rule.min_rows and not rule.min_head_lanes
            and not rule.max_head_lanes and not rule.max_ranks and not rule.min_ranks
            and not rule.slab)


def _where(path: Path) -> str:
    return path.name if path.parent == TABLES_DIR else str(path)


def _path_of(source) -> Path:
    path = Path(source)
    if path.parent == Path(".") and not path.exists():  # a bare name: a shipped table
        path = TABLES_DIR / (source if str(source).endswith(".json") else f"{source}.json")
    return path


def read_table(source, _seen: tuple = ()) -> Table:
    """The table in ``source`` (a path, or the name of a file in ``launch_tables/``), every rule
    checked; a table with ``base`` takes that table's rules for every kind it does not list.
    :class:`TableError` naming the file and the rule otherwise."""
    path = _path_of(source).resolve()
    where = _where(path)
    if path in _seen:
        raise TableError(f"launch table {where}: its base chain comes back to it "
                         f"({' -> '.join(_where(p) for p in _seen + (path,))})")
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise TableError(f"launch table {where}: cannot be read ({e.strerror or e}); the "
                         f"shipped tables: {', '.join(sorted(_shipped_names()))}") from None
    except ValueError as e:
        raise TableError(f"launch table {where}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise TableError(f"launch table {where}: a JSON object expected")
    unknown = sorted(set(doc) - set(_KEYS))
    if unknown:
        raise TableError(f"launch table {where}: unknown key(s) {', '.join(unknown)} (a table "
                         f"has: {', '.join(_KEYS)})")
    if doc.get("format") != TABLE_FORMAT:
        raise TableError(f"launch table {where}: format {doc.get('format')!r}, this code reads "
                         f"format {TABLE_FORMAT}")
    card = doc.get("card")
    if card is not None and not (
            isinstance(card, dict) and set(card) == {"name", "capability", "sms"}
            and isinstance(card["name"], str) and card["name"]
            and isinstance(card["capability"], list) and len(card["capability"]) == 2
            and all(_count(x) for x in card["capability"])
            and _count(card["sms"]) and card["sms"] >= 1):
        raise TableError(f"launch table {where}: card is null or {{\"name\": str, "
                         f"\"capability\": [major, minor], \"sms\": count}}, not {card!r}")
    own = doc.get("rules", {})
    if not isinstance(own, dict) or set(own) - set(KINDS):
        raise TableError(f"launch table {where}: rules is an object of kinds "
                         f"({', '.join(KINDS)}), not {own!r}")
    rules = {}
    for kind, objs in own.items():
        if not isinstance(objs, list) or not objs:
            raise TableError(f"launch table {where}: {kind} rules are a non-empty list")
        parsed = []
        for i, obj in enumerate(objs):
            try:
                parsed.append(rule_from_json(obj, kind))
            except (ValueError, TypeError) as e:
                raise TableError(f"launch table {where}: {kind} rule {i} "
                                 f"({json.dumps(obj)}): {e}") from None
        if not _takes_every_problem(parsed[-1]):
            raise TableError(
                f"launch table {where}: {kind} rule {len(objs) - 1} ({json.dumps(objs[-1])}) is "
                f"the last and must take every problem (max_rows \"any\", no row, lane or rank "
                f"bounds, not the slab kernel)")
        rules[kind] = tuple(parsed)
    base = doc.get("base")
    if base is not None:
        if not isinstance(base, str):
            raise TableError(f"launch table {where}: base names a table file, not {base!r}")
        inherited = read_table(path.parent / base if not Path(base).is_absolute() else base,
                               _seen + (path,))
        rules = {k: rules.get(k, inherited.rules[k]) for k in KINDS}
    missing = [k for k in KINDS if k not in rules]
    if missing:
        raise TableError(f"launch table {where}: no rules for {', '.join(missing)} (and no "
                         f"base to take them from)")
    for k in ("about",):
        if not isinstance(doc.get(k, ""), str):
            raise TableError(f"launch table {where}: {k} is free text")
    if not isinstance(doc.get("sweep") or {}, dict) or not isinstance(doc.get("notes") or {},
                                                                       dict):
        raise TableError(f"launch table {where}: sweep and notes are JSON objects")
    return Table(path.name, path, card, {k: rules[k] for k in KINDS}, doc.get("about", ""),
                 doc.get("sweep"))


def _shipped_names() -> list[str]:
    return sorted(p.name for p in TABLES_DIR.glob("*.json"))


_SHIPPED: dict = {}


def shipped_tables() -> dict[str, Table]:
    """{file name: table} of every table in ``launch_tables/``, read (and checked) once. A
    card's file must be named after its card (``card_file_name``), or lookups by the device's
    name would miss it."""
    if not _SHIPPED:
        found = {}
        for name in _shipped_names():
            table = read_table(name)
            if table.card is not None and card_file_name(table.card["name"]) != name:
                raise TableError(f"launch table {name}: the file of card "
                                 f"{table.card['name']!r} is {card_file_name(table.card['name'])}")
            if table.card is None and name != DEFAULT_TABLE:
                raise TableError(f"launch table {name}: names no card (only {DEFAULT_TABLE} "
                                 "may not)")
            found[name] = table
        if DEFAULT_TABLE not in found:
            raise TableError(f"launch tables: {TABLES_DIR} has no {DEFAULT_TABLE}")
        _SHIPPED.update(found)
    return dict(_SHIPPED)


def table_for_card(name: str, capability: tuple[int, int], sms: int,
                   tables: dict[str, Table] | None = None) -> tuple[Table, str]:
    """(the table of a card, how it was chosen): the file named after the card, else the one
    table whose card has its compute capability and SM count, else the default."""
    tables = shipped_tables() if tables is None else tables
    own = tables.get(card_file_name(name))
    if own is not None:
        return own, f"{own.name}: the device's name ({name})"
    alike = [t for t in tables.values() if t.card is not None
             and tuple(t.card["capability"]) == tuple(capability) and t.card["sms"] == sms]
    if len(alike) == 1:
        return alike[0], (f"{alike[0].name}: the device's compute capability "
                          f"{capability[0]}.{capability[1]} and {sms} SMs ({name})")
    why = (f"as {len(alike)} tables' cards ({', '.join(t.name for t in alike)})" if alike
           else "no table for it")
    return tables[DEFAULT_TABLE], (f"{DEFAULT_TABLE}: the default ({name}, compute capability "
                                   f"{capability[0]}.{capability[1]}, {sms} SMs: {why})")


def _device_table() -> tuple[Table, str]:
    chosen = os.environ.get(TABLE_ENV, "").strip()
    if chosen:
        table = read_table(chosen)
        return table, f"{table.name}: {TABLE_ENV}={chosen}"
    import torch

    if not torch.cuda.is_available():
        return shipped_tables()[DEFAULT_TABLE], f"{DEFAULT_TABLE}: the default (no CUDA device)"
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return table_for_card(p.name, (p.major, p.minor), p.multi_processor_count)


# The H200's table, read at import: the bench's candidate tables below are edits of it, and the
# tests that state its rules pin it.
H200 = read_table("NVIDIA_H200.json")

# The combine rules as the seventeenth pass left them (docs/perf_history.md; the H200 table's notes
# give what each of its rules was chosen from).
_COMBINE_SEVENTEENTH = (
    Rule(128, 512, 1, 8),
    Rule(512, 512, 1, 1, min_rows=256, min_head_lanes=256, max_head_lanes=256),
    Rule(2048, 512, 64, 2, min_rows=256, min_head_lanes=32, max_head_lanes=32),
    Rule(2048, 512, 128, 2, min_rows=256, min_head_lanes=64, max_head_lanes=64),
    Rule(2048, 512, 256, 4, min_rows=256, min_head_lanes=128, max_head_lanes=128),
    Rule(256, 512, 1, 4, min_head_lanes=256),
    Rule(256, 512, 1, 8),
    Rule(512, 512, 1, 1, max_head_lanes=64), Rule(512, 512, 1, 2, max_head_lanes=128),
    Rule(512, 512, 1, 4),
    Rule(1024, 512, 1, 2, min_head_lanes=256, max_head_lanes=256, max_ranks=4),
    Rule(1024, 512, 1, 1), Rule(4096, 512, 1, 2),
    Rule(16384, 512, 1, 4), Rule(_ANY, 256, 8192, 8, per_rank=True),
)
# The nineteenth pass: the eighteenth's rules with two edited and two added (the H200 table's
# combine rules; its notes say what each rule was chosen from).
_COMBINE_NINETEENTH = H200.rules["combine"]
# The eighteenth pass's rules (the bench candidate ``combine_eighteenth_pass``): the
# nineteenth's without what it added or changed.
_NINETEENTH_ADDED = (
    Rule(1024, 512, 1, 2, min_head_lanes=512, max_head_lanes=512),
    Rule(4096, 512, 512, 4, min_rows=2048, min_head_lanes=128, max_head_lanes=128,
         max_ranks=2),
)
_EIGHTEENTH_WAS = {  # a nineteenth-pass rule: the eighteenth's in its place
    Rule(512, 512, 1, 4, min_rows=256, min_head_lanes=256, max_head_lanes=256, max_ranks=4):
        Rule(512, 512, 1, 4, min_rows=256, min_head_lanes=256, max_head_lanes=256, max_ranks=2),
    Rule(1024, 512, 1, 4, min_head_lanes=512, max_head_lanes=512, max_ranks=4):
        Rule(1024, 512, 1, 4, min_head_lanes=512, max_head_lanes=512, max_ranks=2),
}
_COMBINE_EIGHTEENTH = tuple(_EIGHTEENTH_WAS.get(r, r) for r in _COMBINE_NINETEENTH
                            if r not in _NINETEENTH_ADDED)

# The process's table: the default's rules until the first compiled launch, then (in place, so
# that every name for it sees the change) the device's; fixed from then on (``table_in_force``).
TABLE: dict[str, tuple[Rule, ...]] = dict(read_table(DEFAULT_TABLE).rules)
_IN_FORCE: list = []  # [(Table, how it was chosen)] once taken
_TAKING = threading.Lock()


def table_in_force() -> tuple[Table, str]:
    """(the table this process launches with, how it was chosen), taking it on the first call:
    see the module's docstring. Never changes afterwards (CUDA graphs replay what they
    captured)."""
    if not _IN_FORCE:
        with _TAKING:
            if not _IN_FORCE:
                table, why = _device_table()
                TABLE.update(table.rules)  # kind by kind: a reader sees one table's rules
                _IN_FORCE.append((table, why))
    return _IN_FORCE[0]


# Triton's CPU interpreter runs a program at a time through numpy: big tiles, few programs
# (a program spans many tokens: 1024 rows of one head each are 2 programs, not 1024; the pack's
# one token a program made a 1500-token exchange 12 s, now 0.2 s). The programs still run one
# after another, so a staging buffer overlapping the output it packs corrupts bytes on the CPU
# once the launch has several programs, as it does on a GPU once it has several waves
# (test_wire_format's many_waves case: 8192 tokens).
INTERPRETER = {"pack": Rule(_ANY, 1024, 4096, 4, span_tokens=True),
               "combine": Rule(_ANY, 512, 4096, 4, span_tokens=True),
               "scale": Rule(_ANY, 512, 4096, 4, span_tokens=True)}

# The pack rules as the tenth pass left them (docs/perf_history.md): two or four heads and 4
# warps a program for heads of 128 lanes up to 1024 rows; one head and one warp, vector loads,
# for heads of 512 lanes from 2k to 4k rows.
_PACK_TENTH = H200.rules["pack"][:2] + H200.rules["pack"][3:7] + H200.rules["pack"][8:]
# ... and as the ninth pass did: one head a program for heads of 256 lanes up to 256 rows.
_PACK_NINTH = _PACK_TENTH[:1] + _PACK_TENTH[2:]
# ... and as the eighth pass did: one head and one warp a program for heads of 512 lanes from
# 1k to 2k rows.
_PACK_EIGHTH = _PACK_NINTH[:4] + _PACK_NINTH[5:]
# ... and as the seventh pass did: one head a program for heads of 512 lanes up to 1024 rows.
_PACK_SEVENTH = _PACK_EIGHTH[1:]
# ... and as the sixth pass did: no rule of their own for heads of 512 lanes above 1024 rows.
_PACK_SIXTH = _PACK_SEVENTH[:3] + _PACK_SEVENTH[5:]
# ... and as the fifth pass left them: vector loads at every size, 4 warps for every slab
# program of 4096 lanes.
_PACK_FIFTH = (Rule(256, 1024, 256, 4), Rule(1024, 1024, 512, 4), Rule(65536, 1024, 512, 1),
               replace(_PACK_SIXTH[4], slab_warps=((4096, 0, 4), (2048, 0, 8), (1024, 0, 4),
                                                   (0, 0, 1))),
               _PACK_SIXTH[5])

# Tables the benchmark can compare with TABLE in one run, edits of the H200's (``dcp-a2a bench
# --grid --tables table,head_per_program``); docs/perf_history.md has
# the grid where these were chosen.
CANDIDATES: dict[str, dict[str, tuple[Rule, ...]]] = {
    "table": TABLE,
    "head_per_program": {  # one head per program up to 16k rows in both kernels, 4 warps
        "pack": (Rule(16384, 1024, 1, 4), Rule(_ANY, 1024, 4096, 8)),
        "combine": (Rule(16384, 512, 1, 4), Rule(_ANY, 128, 1024, 8)),
        "scale": H200.rules["scale"],
    },
    # pack at decode sizes (docs/perf_history.md, 2026-12-01): 512 lanes a program, 2 warps (the
    # table until then); one head a program with 4 warps; 512 lanes with 4 warps; one head a
    # program also up to 16k rows
    "pack_512_lanes": {**H200.rules, "pack": (Rule(1024, 1024, 512, 2), Rule(_ANY, 1024, 4096, 8))},
    "pack_head_4w": {**H200.rules, "pack": (Rule(1024, 1024, 1, 4), Rule(_ANY, 1024, 4096, 8))},
    "pack_512_lanes_4w": {**H200.rules, "pack": (Rule(1024, 1024, 512, 4),
                                            Rule(_ANY, 1024, 4096, 8))},
    "pack_mid_head": {**H200.rules, "pack": (Rule(1024, 1024, 1, 2), Rule(16384, 1024, 1, 4),
                                        Rule(_ANY, 1024, 4096, 8))},
    # combine at large batches (docs/perf_history.md, third pass): 8 heads x 128 words whatever N
    # (the table until then); the head in one tile, 4 or 8 heads whatever N; 4096 / N lanes
    "combine_slab_128": {**H200.rules,
                         "combine": H200.rules["combine"][:-1] + (Rule(_ANY, 128, 1024, 8),)},
    "combine_one_tile": {**H200.rules,
                         "combine": H200.rules["combine"][:-1] + (Rule(_ANY, 256, 1024, 8),)},
    "combine_one_tile_8h": {**H200.rules,
                            "combine": H200.rules["combine"][:-1] + (Rule(_ANY, 256, 2048, 8),)},
    "combine_per_rank_4k": {**H200.rules, "combine": H200.rules["combine"][:-1] + (
        Rule(_ANY, 256, 4096, 8, per_rank=True),)},
    # pack at large batches: 8 warps (the table until then), 16 warps whatever the peers
    "pack_8w": {**H200.rules, "pack": (Rule(1024, 1024, 1, 2), Rule(_ANY, 1024, 4096, 8))},
    "pack_16w": {**H200.rules, "pack": (Rule(1024, 1024, 1, 2), Rule(_ANY, 1024, 4096, 16))},
    # the pack rules of the fourth pass (the row kernel at every size)
    "pack_fourth_pass": {**H200.rules, "pack": _PACK_FIFTH[:3] + _PACK_FIFTH[4:]},
    # the pack rules of the fifth pass (vector loads at every size)
    "pack_fifth_pass": {**H200.rules, "pack": _PACK_FIFTH},
    # sixth pass (docs/perf_history.md): lane loads also up to 64k rows; the slab kernel (one warp,
    # 512 lanes) from 8k to 64k rows where it fits; lane loads for every head up to 1024 rows
    "pack_lane_mid": {**H200.rules, "pack": _PACK_SIXTH[:3] + (
        Rule(65536, 1024, 512, 1, lane_loads=True),) + _PACK_SIXTH[4:]},
    "pack_slab_mid": {**H200.rules, "pack": _PACK_SIXTH[:3] + (
        Rule(8192, 1024, 512, 1), Rule(65536, 1024, 512, 1, slab=True, slab_warps=((0, 0, 1),)))
        + _PACK_SIXTH[3:]},
    "pack_lane_all": {**H200.rules, "pack": (_PACK_SIXTH[0], replace(_PACK_SIXTH[1],
                                                                max_head_lanes=0))
                      + _PACK_SIXTH[3:]},
    # the pack rules of the sixth and seventh passes
    "pack_sixth_pass": {**H200.rules, "pack": _PACK_SIXTH},
    "pack_seventh_pass": {**H200.rules, "pack": _PACK_SEVENTH},
    "pack_eighth_pass": {**H200.rules, "pack": _PACK_EIGHTH},
    "pack_ninth_pass": {**H200.rules, "pack": _PACK_NINTH},
    "pack_tenth_pass": {**H200.rules, "pack": _PACK_TENTH},
    # the combine rules of the seventeenth pass (8 warps for small heads up to 256 rows, one
    # head a program up to 16k rows)
    "combine_seventeenth_pass": {**H200.rules, "combine": _COMBINE_SEVENTEENTH},
    "combine_eighteenth_pass": {**H200.rules, "combine": _COMBINE_EIGHTEENTH},
    # ... and with four 40-lane heads a program at 2k-4k rows in groups of 8 too (a63fcd4)
    "combine_a63fcd4": {**H200.rules, "combine": tuple(r for r in _COMBINE_EIGHTEENTH
                                                   if not r.min_ranks)},
    # the combine's rules with a head-major grid where a problem has more than 1024 rows (the
    # twenty-sixth pass: 1.5-4 % faster than token-major at 4096-8192 rows of 256-lane heads,
    # none at 1024; docs/perf_history.md): every rule of more than 1024 rows on that grid, to
    # time at the grid's points before any rule of the table takes it
    "combine_head_major": {**H200.rules, "combine": tuple(
        replace(r, head_major=True) if r.max_rows > 1024 else r for r in H200.rules["combine"])},
    # the pack rules of the third pass (one head a program and 2 warps up to 1024 rows, 4096
    # lanes and 8 warps above)
    "pack_third_pass": {**H200.rules, "pack": (
        Rule(1024, 1024, 1, 2), Rule(32768, 1024, 4096, 8),
        Rule(_ANY, 1024, 4096, 8, one_peer_warps=16))},
}

OVERRIDES: dict[str, Launch] = {}


ACTIVE = TABLE  # the table in use; the benchmark swaps in CANDIDATES to compare them



def _fit(block: int, n: int) -> int:
    return max(1, min(block, next_pow2(n)))


def slab_heads(block: int, heads: int, ranks: int) -> int:
    """Heads of a slab-kernel program asked for ``block``: a power of two, at least 4 and at
    most the largest power of two dividing a peer's H/N (a multiple of 4 where the slab kernel
    fits), so that a program's heads are one peer's and its chunk starts on 16 bytes."""
    per_peer = heads // ranks
    return max(4, min(prev_pow2(max(1, block)), per_peer & -per_peer))


# CUDA's limit on a grid's second axis: a head-major grid has its token blocks there.
_MAX_GRID_Y = 65535


def _compiled(cfg: Launch, batch: int = 1) -> Launch:
    """One token a program when compiled. Several (BLOCK_B > 1) exist for the interpreter's
    sake; compiled, the pack with BLOCK_B = 2 stopped on a misaligned address on an H200
    (Triton 3.6 vectorised a store over the flattened token x head index), so no compiled
    launch uses them. A head-major launch of more token blocks than a grid's second axis
    holds becomes token-major (the same bytes, programs in another order)."""
    if not _env.INTERPRET and cfg.block_b != 1:
        cfg = replace(cfg, block_b=1)
    if cfg.head_major and -(-batch // cfg.block_b) > _MAX_GRID_Y:
        cfg = replace(cfg, head_major=False)
    return cfg


# The launch each problem got, so that an eager call looks it up instead of walking the rules
# (their Launch objects and row arithmetic were microseconds of Python a call). An entry keeps
# the rules it was chosen from and counts only while they are still the ones in force: the
# benchmark swaps ACTIVE, tests flip the interpreter; overrides are never cached. The table a
# process takes at its first compiled launch is read on a miss only, so a hit costs what it
# did with one table in the code.
# The returned Launch is the same object on every hit, which lets the launchers key their own
# per-launch caches on it.
_CHOSEN: dict[tuple, tuple] = {}
_CHOSEN_MAX = 4096  # distinct problems (batch sizes) kept; then it starts again


def launch(kind: str, batch: int, heads: int, head_lanes: int, ranks: int = 1,
           slab_ok: bool = False) -> Launch:
    """The launch for kernel ``kind`` over ``batch`` tokens of ``heads`` heads of
    ``head_lanes`` lanes, in a group of ``ranks`` (the rules select on the rows, batch x
    heads; ``slab_ok``: the pack's slab kernel fits the problem). An override asking for the
    slab kernel gets it where it fits, the row kernel elsewhere; one asking for ``split_d``
    gets the head's lanes in that many tiles a program (the combine)."""
    if OVERRIDES and kind in OVERRIDES:
        o = OVERRIDES[kind]
        block_d, split_d = min(o.block_d, next_pow2(head_lanes)), 1
        if o.split_d > 1:
            if kind != "combine":
                raise ValueError(f"split_d asks for a head over several programs: only the "
                                 f"combine takes it, not the {kind} kernel")
            # tiles of the head's power of two over split_d (block_d unused), as many as cover it
            block_d = max(1, next_pow2(head_lanes) // o.split_d)
            split_d = -(-head_lanes // block_d)
        if o.slab and slab_ok:
            return _compiled(Launch(slab_heads(o.block_h, heads, ranks), block_d, o.num_warps,
                                    o.stream, slab=True, head_major=o.head_major), batch)
        return _compiled(Launch(_fit(o.block_h, heads), block_d, o.num_warps, o.stream,
                                _fit(o.block_b, batch), lane_loads=o.lane_loads,
                                head_major=o.head_major, split_d=split_d), batch)
    rules = INTERPRETER[kind] if _env.INTERPRET else ACTIVE[kind]
    key = (kind, batch, heads, head_lanes, ranks, slab_ok)
    hit = _CHOSEN.get(key)
    if hit is not None and hit[0] is rules:
        return hit[1]
    if _env.INTERPRET:
        cfg = rules.launch(batch, heads, head_lanes, ranks)
    else:
        if not _IN_FORCE:  # the first compiled launch: this process takes its table
            table_in_force()
            rules = ACTIVE[kind]
        cfg = _compiled(first_launch(rules, batch, heads, head_lanes, ranks, slab_ok), batch)
    if len(_CHOSEN) >= _CHOSEN_MAX:
        _CHOSEN.clear()
    _CHOSEN[key] = (rules, cfg)
    return cfg


def first_launch(rules, batch: int, heads: int, head_lanes: int, ranks: int = 1,
                 slab_ok: bool = False) -> Launch:
    """The launch of the first of ``rules`` (one kind's, in a table's order) that takes the
    problem; every table's last rule takes any (checked when a table is read)."""
    taken = (r.launch(batch, heads, head_lanes, ranks, slab_ok) for r in rules
             if batch * heads <= r.max_rows)
    return next(c for c in taken if c is not None)


def every_launch(kind: str, batch: int, heads: int, head_lanes: int,
                 ranks: int = 1, slab_ok: bool = False) -> list[Launch]:
    """Every launch any rule gives this problem, whatever rule its row count selects (a slab
    rule whatever the program's size): the rules of the table in use (``ACTIVE``), of every
    shipped card's table and of the table this process took, and the interpreter's. The
    tests run them all, so the bits never depend on which card's table a process took."""
    table_in_force()
    tables = [ACTIVE, TABLE] + [t.rules for t in shipped_tables().values()]
    return launches_of([r for t in tables for r in t[kind]] + [INTERPRETER[kind]],
                       batch, heads, head_lanes, ranks, slab_ok)


def launches_of(rules, batch: int, heads: int, head_lanes: int, ranks: int = 1,
                slab_ok: bool = False) -> list[Launch]:
    """The distinct launches ``rules`` give this problem, whatever their bounds."""
    seen = []
    for rule in rules:
        cfg = rule.launch(batch, heads, head_lanes, ranks, slab_ok, any_size=True)
        if cfg is not None and _compiled(cfg, batch) not in seen:
            seen.append(_compiled(cfg, batch))
    return seen


def exact_rule(kind: str, cfg: Launch, batch: int, heads: int, head_lanes: int,
               ranks: int = 1, slab_ok: bool = False, why: str | None = None) -> Rule:
    """A rule that takes exactly this problem (its rows, head lanes and group size) and gives
    it the launch ``cfg`` (as ``launch`` gives it under that override): what a sweep adds to a
    card's table for a problem it timed. ValueError where no rule can give ``cfg``."""
    rows = batch * heads
    bounds = dict(max_rows=max(1, rows), min_rows=max(0, rows - 1),
                  min_head_lanes=head_lanes, max_head_lanes=head_lanes,
                  min_ranks=ranks, max_ranks=ranks)
    split = 1
    if cfg.split_d > 1:
        split = next_pow2(head_lanes) // cfg.block_d
    if cfg.slab:
        rule = Rule(block_d_cap=cfg.block_d, lanes=cfg.block_h * cfg.block_d,
                    num_warps=cfg.num_warps, stream=cfg.stream, slab=True,
                    slab_warps=((0, 0, cfg.num_warps),), head_major=cfg.head_major, **bounds)
    else:
        rule = Rule(block_d_cap=cfg.block_d if split == 1 else next_pow2(head_lanes),
                    lanes=cfg.block_h * cfg.block_d, num_warps=cfg.num_warps, stream=cfg.stream,
                    lane_loads=cfg.lane_loads, head_major=cfg.head_major, split_d=split,
                    **bounds)
    got = rule.launch(batch, heads, head_lanes, ranks, slab_ok)
    want = _compiled(cfg, batch)
    if got is None or _compiled(got, batch) != want:
        raise ValueError(f"no rule gives the {kind} launch {cfg} at B*H={rows}, {head_lanes} "
                         f"lanes, {ranks} ranks (a rule gives {got})")
    try:  # the rule as a table would read it
        rule_from_json(json.loads(json.dumps(rule_to_json(rule))), kind)
    except ValueError as e:
        raise ValueError(f"the {kind} rule for {cfg} is not a valid table rule: {e}") from None
    return rule


def pack_launch(batch: int, heads: int, head_lanes: int, ranks: int,
                slab_ok: bool = False) -> Launch:
    return launch("pack", batch, heads, head_lanes, ranks, slab_ok)


def combine_launch(ranks: int, batch: int, heads: int, head_lanes: int) -> Launch:
    return launch("combine", batch, heads, head_lanes, ranks)


def scale_launch(ranks: int, batch: int, heads: int, head_lanes: int) -> Launch:
    return launch("scale", batch, heads, head_lanes)
