"""Paired GSM8K statistics of runs made apart by ``python -m dcp_a2a.evals.gsm8k``:

    python -m dcp_a2a.evals.pair BASE[:BACKEND] OTHER[:BACKEND] ... [--out DIR]

The first run is the baseline; each other run is paired with it question by question, as the
driver pairs the backends of one run (``evals.records.paired``: answer agreement, correctness
flips each way, McNemar's exact test, identical generations). BASE and OTHER are a driver's
``--out`` directory or a results JSON file -- ``results.json``, or a copy committed under
docs/results: its per-question records (evals/records.py: answers, correctness, a hash of
each generation) are all the statistics need but the token-prefix agreement, which needs the
texts of ``samples_<backend>.jsonl`` and the model's tokenizer ("n/a" without them). A path
stands for every backend it holds, or for the one named after the colon. Made for backends
run as separate jobs (in parallel, or on different machines), and for the floor a 16-bit run
is read against: the unsharded ``reference`` in bfloat16 paired with the unsharded
``reference`` in float32.

The runs must share the model, the questions (``--limit``) and the generation length
(``--max-gen-toks``); a run is labelled by its backend and by the settings in which the runs
differ (dtype, DCP size, LSE base, ...). Writes ``results.json`` and ``results.md`` under
``--out``, in the driver's format, with ``sources``: each label's directory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .gsm8k import markdown, write_report
from .inputs import ArgumentParser, HelpFormatter, MissingInput, fail
from .records import paired, question_records

PROG = "python -m dcp_a2a.evals.pair"
# settings that make two runs' questions or answers incomparable
SAME = ("model", "pretrained", "gguf_file", "limit", "max_gen_toks")
# settings a run is labelled by where the runs differ in them
LABELLED = ("dtype", "dcp_size", "lse_base", "shard", "combine", "interleave", "wire_dtype",
            "kv_cache", "distributed")


def load_runs(spec: str) -> list[dict]:
    """The runs of one ``PATH[:BACKEND]``: each driver run record with its per-question
    ``samples`` (the texts of ``samples_<backend>.jsonl`` where the directory has them, else
    the records kept in the results file, :mod:`evals.records`), its ``config`` and its
    ``source``. PATH: a driver's ``--out`` directory, or a results JSON file (``results.json``
    or a copy, as kept under docs/results)."""
    where, colon, only = spec.rpartition(":")
    if not colon or Path(spec).exists():  # no backend named (or a colon in the path itself)
        where, only = spec, ""
    path = Path(where)
    res = path if path.is_file() else path / "results.json"
    d = res.parent
    if not res.is_file():
        raise MissingInput(f"{res} not found",
                           "pass the --out directory of a python -m dcp_a2a.evals.gsm8k run, "
                           "or its results JSON file")
    try:
        report = json.loads(res.read_text())
        runs = [r for r in report["runs"] if not only or r["backend"] == only]
    except (ValueError, KeyError, TypeError) as e:
        raise MissingInput(f"{res} is not a GSM8K results file ({type(e).__name__}: {e})",
                           "pass a results.json written by python -m dcp_a2a.evals.gsm8k or "
                           "python -m dcp_a2a.evals.pair") from None
    if not runs:
        raise MissingInput(f"{res} holds no run of backend {only} (it holds "
                           f"{', '.join(r['backend'] for r in report['runs'])})",
                           f"name one of those after the colon, or pass {where} alone")
    out = []
    for r in runs:
        f = d / f"samples_{r['backend']}.jsonl"
        if res.name == "results.json" and f.is_file():
            samples = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        elif r.get("questions"):
            samples = r["questions"]
        else:
            raise MissingInput(f"{res} keeps no per-question records of {r['backend']} (a run "
                               f"written before they were kept) and {f} is not there",
                               "pass the run's --out directory with its samples_<backend>.jsonl")
        run = {k: v for k, v in r.items() if k not in ("questions", "config")}
        out.append(dict(run, samples=samples, config=r.get("config", report["config"]),
                        source=str(path)))
    return out


def _shown(key, value) -> str:
    if key == "distributed":  # False, or the process group's description
        return (f"{value['world_size']} torchrun ranks ({value['process_group']})"
                if isinstance(value, dict) else "one process")
    return f"{key}={value}"


def comparable(runs: list[dict]) -> None:
    """ValueError unless ``runs`` are a baseline and runs to pair with it on the same
    questions: the settings of ``SAME`` and the question ids equal."""
    if len(runs) < 2:
        raise ValueError(f"need a baseline and at least one run to pair with it, got "
                         f"{len(runs)} run(s)")
    base = runs[0]
    c0 = base["config"]
    for r in runs[1:]:
        diff = [k for k in SAME if r["config"].get(k) != c0.get(k)]
        if diff:
            raise ValueError(
                f"{r['source']} ({r['backend']}) is not comparable with the baseline "
                f"{base['source']} ({base['backend']}): " + ", ".join(
                    f"{k} {r['config'].get(k)!r} against {c0.get(k)!r}" for k in diff))
        if {s["doc_id"] for s in r["samples"]} != {s["doc_id"] for s in base["samples"]}:
            raise ValueError(f"{r['source']} ({r['backend']}) answered other questions than "
                             f"the baseline {base['source']}")


def pair_runs(runs: list[dict], tokenizer) -> dict:
    """The report of ``runs`` paired with ``runs[0]`` (checked by :func:`comparable` first)."""
    comparable(runs)
    base = runs[0]
    c0 = base["config"]
    varies = [k for k in LABELLED if len({json.dumps(r["config"].get(k), sort_keys=True)
                                          for r in runs}) > 1]
    labels = []
    for r in runs:
        # run_backend: the backend of a run read back from a paired report (whose "backend"
        # is its label there)
        label = r.get("run_backend", r["backend"]) + "".join(
            f", {_shown(k, r['config'].get(k))}" for k in varies)
        if label in labels:  # the same backend and settings twice: a repeat run
            label += f" [{r['source']}]"
        labels.append(label)
    return {"config": c0, "baseline": labels[0],
            "sources": dict(zip(labels, (r["source"] for r in runs))),
            # each run keeps its settings and per-question records: the report can be paired
            # again (python -m dcp_a2a.evals.pair REPORT.json:LABEL ...)
            "runs": [dict({k: v for k, v in r.items() if k not in ("samples", "source")},
                          backend=label, run_backend=r.get("run_backend", r["backend"]),
                          questions=question_records(r["samples"]))
                     for r, label in zip(runs, labels)],
            "paired": {label: paired(base, r, tokenizer)
                       for r, label in zip(runs[1:], labels[1:])}}


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="PATH[:BACKEND]",
                    help="driver output directories or results JSON files; the first run is "
                         "the baseline")
    ap.add_argument("--out", default="out/gsm8k_paired", help="output directory")
    ap.add_argument("--no-token-prefix", dest="token_prefix", action="store_false",
                    help="skip the token-prefix agreement (it needs every run's texts and the "
                         "model's tokenizer, so the model prepared here); the other statistics "
                         "come from the per-question records")
    return ap


def main(argv=None) -> dict:
    ap = parser()
    args = ap.parse_args(argv)
    from .model import load_tokenizer

    try:
        runs = [r for spec in args.runs for r in load_runs(spec)]
        comparable(runs)
        c0 = runs[0]["config"]
        texts = all("generation" in s for r in runs for s in r["samples"])
        tokenizer = None
        if texts and args.token_prefix:
            tokenizer = load_tokenizer(c0.get("pretrained"), c0.get("gguf_file"),
                                       None if c0.get("pretrained") else c0["model"])
    except MissingInput as e:
        fail(PROG, MissingInput(e.what, e.fix + " (or pass --no-token-prefix)"
                                if "model" in e.what else e.fix))
    except ValueError as e:
        ap.error(str(e))
    report = pair_runs(runs, tokenizer)
    write_report(Path(args.out), report)
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
