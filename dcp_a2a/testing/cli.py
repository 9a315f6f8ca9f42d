"""``dcp-a2a``: the suite's one command line (also ``python -m dcp_a2a``).

    dcp-a2a validate     every test tier this machine supports, one verdict, a report
    dcp-a2a accuracy     lse_reduce on a real process group against the float64 oracle
    dcp-a2a bench        kernel timings (--grid: against the baselines; --collective: the
                         exchange end to end, under torchrun)
    dcp-a2a self-check   every shipped mutant caught, every correct implementation passing
    dcp-a2a gpu-check    on a GPU machine before merging: validate, self-check, accuracy, bench
    dcp-a2a engines      the conformance suite over every engine adapter: engine x clause table
    dcp-a2a tune         derive this card's launch table from a sweep on it

The programs that run per rank start under torchrun the same way::

    torchrun --nproc-per-node 2 -m dcp_a2a accuracy ...
    torchrun --nproc-per-node 2 -m dcp_a2a bench --collective ...

Every program takes its flags by the rules of :mod:`.args` (a bad value is one line and exit
status 2 before any work; a flag declared with a plain type gets the shared rule of its kind,
:data:`SHARED_TYPES`). Each program is a module with ``add_arguments(parser)`` and
``main(args)`` (and a ``SUMMARY`` line); the old entry points (``python -m
dcp_a2a.testing.accuracy``, ``.bench``, ``.selfcheck``, the ``dcp-a2a-bench`` script) run the
same program.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from . import args as a
from .args import EXIT_USAGE, Parser

# command -> the module of its program
PROGRAMS = {
    "validate": "validate",
    "accuracy": "accuracy",
    "bench": "bench",
    "self-check": "selfcheck",
    "gpu-check": "gpucheck",
    "engines": "engines",
    "tune": "tune",
}
EXIT_OK = 0


def program(command: str):
    return importlib.import_module(f"{__package__}.{PROGRAMS[command]}")


def _version() -> str:
    """``dcp-a2a X.Y.Z (path)``: which installation answers, as `pip -V` says it."""
    import dcp_a2a

    return f"dcp-a2a {dcp_a2a.__version__} ({Path(dcp_a2a.__file__).parent})"


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    """The ``dcp-a2a`` parser and {command: its subparser}."""
    p = Parser(prog="dcp-a2a", formatter_class=_Formatter,
               description="dcp_a2a: the packed all-to-all combine for Decode Context "
                           "Parallel attention, and its validation suite.",
               epilog="Under torchrun (one process per rank):\n"
                      "  torchrun --nproc-per-node N -m dcp_a2a accuracy [FLAGS]\n"
                      "  torchrun --nproc-per-node N -m dcp_a2a bench --collective [FLAGS]\n"
                      "Every program: a bad flag value is one line and exit status 2, before "
                      "any work;\n`dcp-a2a COMMAND --help` lists its flags.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    subs = {}
    for command in PROGRAMS:
        mod = program(command)
        summary = getattr(mod, "SUMMARY", None) or _first_line(mod.__doc__)
        sp = sub.add_parser(command, help=summary,
                            description=getattr(mod, "DESCRIPTION", summary),
                            epilog=getattr(mod, "EPILOG", None))
        mod.add_arguments(sp)
        _share_rules(sp)
        subs[command] = sp
    return p, subs


def _first_line(doc: str | None) -> str:
    line = (doc or "").strip().split("\n\n")[0].replace("\n", " ").replace("``", "")
    return line.split(": ", 1)[-1] if line.startswith("dcp-a2a") else line


def _tiers(value: str) -> str:
    from .tiers import TIERS

    return ",".join(a.items(TIERS, "tier")(value))


def _release_dir(value: str) -> Path:
    return Path(a.existing_dir(value)).expanduser()


# What a flag of a given name and kind takes in every program (.args): applied to the flags a
# program declared with plain types, so that none of them takes a value the others refuse.
# (dest, metavar) -> type; the value each gives is what the plain type gave (a string for tiers,
# a path for a folder read), so the program reads it as before.
SHARED_TYPES = {("out", "DIR"): a.out_dir, ("tiers", "T1,T2"): _tiers,
                ("workers", "N"): a.processes, ("releases", "DIR"): _release_dir,
                ("engine", "SPEC"): a.text("an implementation spec"),
                ("doc", "FILE"): lambda v: Path(a.existing_file(v)),
                ("from_report", "JSON"): lambda v: Path(a.existing_file(v))}


def _share_rules(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        rule = SHARED_TYPES.get((action.dest, action.metavar))
        if rule is not None and action.type in (None, str, Path):
            action.type = rule


def _refuse_repeats(parser: argparse.ArgumentParser, args) -> None:
    """A repeatable flag (``action="append"``) given the same value twice: a usage error."""
    for action in parser._actions:
        if isinstance(action, argparse._AppendAction):
            values = getattr(args, action.dest, None) or []
            twice = sorted({str(v) for v in values if values.count(v) > 1})
            if twice:
                parser.error(f"argument {action.option_strings[-1]}: {', '.join(twice)} "
                             "given twice")


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` (after ``dcp-a2a``) parsed and checked: every flag by its type, then what the
    program checks across its flags (its ``check(parser, args)``). ``args.argv`` is ``argv``."""
    parser, subs = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv)
    if args.command is not None:
        _refuse_repeats(subs[args.command], args)
        check = getattr(program(args.command), "check", None)
        if check is not None:
            check(subs[args.command], args)
    return args


def arguments(command: str, args=None) -> argparse.Namespace:
    """A program's arguments: ``args`` as given when parsed already (by :func:`main`), else the
    argument list ``args`` (None: ``sys.argv[1:]``) parsed as ``dcp-a2a COMMAND ARGS`` -- the
    old module entry points and the console script ``dcp-a2a-bench`` run through here."""
    if isinstance(args, argparse.Namespace):
        return args
    argv = sys.argv[1:] if args is None else list(args)
    return parse([command, *argv])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    if args.command is None:
        build_parser()[0].print_help()
        return EXIT_USAGE
    return program(args.command).main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
