"""``dcp-a2a engines``: the conformance suite over every engine adapter, one engine x clause
table. (A placeholder until the program lands: its flags are the shared ones it will take.)"""

from __future__ import annotations

import argparse
import sys

from . import args as a

SUMMARY = "run the conformance suite over every engine adapter and write an engine x clause table"


def _engine(value: str) -> str:
    from .impl import ENGINES, engine_spec

    spec = a.text("an engine spec ENGINE[:VARIANT][=PATH]")(value)
    try:
        found = engine_spec(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if found is None:
        raise argparse.ArgumentTypeError(
            f"unknown engine {spec.partition('=')[0].partition(':')[0]!r}; expected one of "
            f"{', '.join(ENGINES)} as ENGINE[:VARIANT][=PATH]")
    return spec


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .tiers import TIERS

    p.add_argument("--engine", action="append", type=_engine, default=None, metavar="SPEC",
                   help="an engine adapter ENGINE[:VARIANT][=PATH], repeatable (default: every "
                        "engine installed here)")
    p.add_argument("--out", type=a.out_dir, default="engines-report", metavar="DIR",
                   help="report directory, created if missing (default ./engines-report)")
    p.add_argument("-j", "--workers", type=a.workers, default=None, metavar="N",
                   help="pytest-xdist workers ('auto' = one per CPU, 0 = no xdist)")
    p.add_argument("--tiers", type=a.items(TIERS, "tier"), default=None, metavar="T1,T2",
                   help="tiers to run for each engine (default: conformance)")
    p.add_argument("--quick", action="store_true", help="the quick subset of each tier")


def check(parser, args) -> None:
    if args.engine:
        twice = sorted({e for e in args.engine if args.engine.count(e) > 1})
        if twice:
            parser.error(f"argument --engine: {', '.join(twice)} given twice")


def main(args) -> int:
    print("dcp-a2a engines: not yet", file=sys.stderr)
    return 3  # asked for, cannot run here (validate's exit status for that)
