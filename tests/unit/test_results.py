"""docs/results holds the latest result per benchmark and card, each saying which card, commit
and command made it, and docs/perf.md's table of today's numbers is the one those files give
(``python benchmarks/results.py --write docs/perf.md`` rewrites it)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
FILES = sorted(RESULTS.glob("*/*.json"))


def _results_tool():
    spec = importlib.util.spec_from_file_location("_results_tool", ROOT / "benchmarks" /
                                                  "results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_there_are_results():
    assert len(FILES) >= 10 and {"grid", "decode_vs_vllm"} <= {p.parent.name for p in FILES}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_result_says_where_it_comes_from(path):
    run = json.loads(path.read_text())["run"]
    assert re.fullmatch(r"[0-9a-f]{40}", run["commit"] or ""), run.get("commit")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", run["date"]), run["date"]
    label = _results_tool().card_label(path.stem)  # h100 -> H100, h200x4 -> 4 × H200
    card = label.split(" × ")[-1]
    assert card.lower() in run["card"].lower(), (path.stem, run["card"])
    if " × " in label:
        assert run["card"].startswith(label.split(" × ")[0]), (path.stem, run["card"])
    md = path.with_suffix(".md").read_text()
    assert f"- card: {run['card']}" in md and run["commit"] in md, \
        f"{path.with_suffix('.md')} names another run than its JSON"
    header = md.split("\n\n", 1)
    assert len(header) == 2 and "|" in header[1] or "```" in md, \
        "the .md holds the table the run printed after its header"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_result_names_a_command_that_exists(path):
    """A result's command runs a script of the checkout or a module of the package, so the
    command shown next to today's numbers is one a reader can run."""
    argv = shlex.split(json.loads(path.read_text())["run"]["command"])
    scripts = [b for a, b in zip(argv, argv[1:]) if re.fullmatch(r"python3?", a)
               and b.endswith(".py")]
    modules = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"]
    assert scripts or modules, argv
    for s in scripts:
        assert (ROOT / s).is_file(), f"{path.relative_to(ROOT)}: {s} is not in the checkout"
    for m in modules:
        assert importlib.util.find_spec(m) is not None, f"{path.relative_to(ROOT)}: no {m}"


def test_every_results_folder_holds_json_and_md_pairs_only():
    stray = [p.relative_to(ROOT) for p in RESULTS.rglob("*")
             if p.is_file() and (p.suffix not in (".json", ".md")
                                 or not p.with_suffix(".json").exists()
                                 or not p.with_suffix(".md").exists()
                                 or p.parent.parent != RESULTS)]
    assert not stray, f"not a <benchmark>/<card>.json + .md pair: {stray}"


def test_docs_hold_no_result_data_outside_docs_results():
    stray = [p.relative_to(ROOT) for p in (ROOT / "docs").rglob("*")
             if p.is_file() and p.suffix not in (".md", ".py", ".pyc")
             and RESULTS not in p.parents]
    assert not stray, f"results belong in docs/results/<benchmark>/<card>.json: {stray}"


@pytest.mark.parametrize("doc", ["perf.md", "evals.md"])
def test_the_docs_show_the_numbers_the_results_give(doc):
    tool = _results_tool()
    shown = tool.in_doc((ROOT / "docs" / doc).read_text())
    assert shown is not None, f"docs/{doc} lost its results table markers"
    assert shown == tool.block(doc), (f"docs/{doc}'s results table is stale: run "
                                      f"python benchmarks/results.py --write docs/{doc}")


def test_perf_md_opens_with_todays_numbers():
    tool = _results_tool()
    text = (ROOT / "docs" / "perf.md").read_text()
    shown = tool.in_doc(text)
    today = text.index("## Today's numbers")
    assert today == text.index("\n## ") + 1 and today < text.index(shown) < \
        text.index("\n## ", today + 1), "today's numbers are the first section"


def test_the_table_follows_a_changed_result(tmp_path):
    """The check is not vacuous: a result that moves changes the generated table."""
    tool = _results_tool()
    results = tool.load()
    before = tool.summary(results)
    row = results["decode_vs_vllm"]["h100"]["graph"][0]
    row["ours_over_vllm"] = 0.1234
    assert tool.summary(results) != before and "0.123" in tool.summary(results)
    evals = tool.summary(results, evals=True)
    results["gsm8k_qwen2.5-coder-1.5b_float32"]["h100"]["runs"][1]["em"]["strict-match"]["em"] = 0.5
    assert tool.summary(results, evals=True) != evals


def test_results_check_exits_1_on_a_stale_doc(tmp_path, capsys):
    tool = _results_tool()
    doc = tmp_path / "perf.md"
    doc.write_text(f"# x\n\n{tool.block().splitlines()[0]}\n| stale |\n{tool.END}\n")
    assert tool.main(["--check", str(doc)]) == 1
    assert tool.main(["--write", str(doc)]) == 0 and tool.main(["--check", str(doc)]) == 0
    assert tool.summary() in doc.read_text()


def test_card_names_are_checked():
    tool = _results_tool()
    assert [tool.card_label(s) for s in ("cpu", "h100", "h200x4")] == ["CPU", "H100",
                                                                       "4 × H200"]
    with pytest.raises(ValueError, match="card name"):
        tool.card_label("H100 80GB")

