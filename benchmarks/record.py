"""Record a benchmark command that writes its own JSON (the installed bench: the grid, the named
shapes, the exchange) as a result: run it, then add the run's card, commit, date and command to
that JSON and write what it printed to the ``.md`` beside it, as the scripts here do themselves.

    python benchmarks/record.py docs/results/grid/h100.json -- \\
        dcp-a2a bench --grid --out docs/results/grid/h100.json

The command's exit status is this one's; nothing is added when it fails or writes no JSON.
For a command run by torchrun, only rank 0's output is kept by the bench, so record the
torchrun command itself.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import _run


def main(argv=None) -> int:
    ap = _run.parser(__doc__, "record.py")
    ap.add_argument("out", metavar="OUT.json", type=Path, help="the JSON the command writes")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- then the command (it must write OUT.json)")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --")
    if args.out.suffix != ".json":
        ap.error(f"OUT.json must end in .json, got {args.out}")
    before = args.out.stat().st_mtime_ns if args.out.exists() else None
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    printed = []
    for line in proc.stdout:
        sys.stdout.write(line)
        printed.append(line)
    rc = proc.wait()
    if rc:
        return rc
    if not args.out.exists() or args.out.stat().st_mtime_ns == before:
        print(f"record.py: {shlex.join(command)} wrote no {args.out}; nothing recorded",
              file=sys.stderr)
        return 1
    run = {**_run.provenance(command), "command": shlex.join(command)}
    data = json.loads(args.out.read_text())
    body = {**data, "run": run} if isinstance(data, dict) else {"rows": data, "run": run}
    args.out.write_text(json.dumps(body, indent=1) + "\n")
    benchmark = args.out.parent.name
    args.out.with_suffix(".md").write_text(
        _run.header(benchmark, run) + "\n```text\n" + "".join(printed).rstrip() + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
