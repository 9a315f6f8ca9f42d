"""The user docs say how to use the suite in words that stay true: no commit hashes and no
tracker numbers in them (a reader outside this repository's history can use neither), and the
mutant corpus docs/conformance.md lists is the corpus that ships. Counts and times the docs show
come from docs/results (tests/unit/test_results.py) or are checked here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
TRACKER = re.compile(r"\bissues? ?#?\d+\b", re.I)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_commit_hashes(doc):
    found = sorted(set(HASH.findall(doc.read_text())))
    assert not found, f"{doc.relative_to(ROOT)} names commits {found}: results files keep " \
                      "the commit a number was measured at (docs/results), docs say what to do"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_tracker_numbers(doc):
    found = sorted(set(TRACKER.findall(doc.read_text())))
    assert not found, f"{doc.relative_to(ROOT)} names {found}: say what the thing does"


def test_the_patterns_find_what_they_look_for():
    assert HASH.findall("at 14b51ec and 06c8cc49a2ff11db36fc389ee02953070f401de2, not 1234567")\
        == ["14b51ec", "06c8cc49a2ff11db36fc389ee02953070f401de2"]
    assert not HASH.findall("deadbeef-free text, 0x7FC0, abcdefa")  # no digit: a word
    said = ["issue 4" + "7", "Issue 2" + "2", "issues #" + "3"]  # spelt apart: a repo grep
    assert TRACKER.findall(f"{said[0]}'s tables; {said[1]}: ...; {said[2]}") == said


def _corpus() -> dict[str, tuple[str, int]]:
    """{mutant: (its docstring's first line, NEEDS_GPUS)} of dcp_a2a/testing/mutants/."""
    out = {}
    for path in sorted((ROOT / "dcp_a2a" / "testing" / "mutants").glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        doc = (ast.get_docstring(tree) or "").strip().split("\n\n")[0]
        gpus = next((n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and any(getattr(t, "id", None) == "NEEDS_GPUS" for t in n.targets)), 0)
        out[path.stem] = (" ".join(doc.split()), gpus)
    return out


def test_conformance_md_lists_the_corpus_that_ships():
    text = (ROOT / "docs" / "conformance.md").read_text()
    section = text.split("### The corpus and its kill table", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \| (.*) \|$", section, re.M)
    listed = {name: (" ".join(cls.split()), 0 if needs == "-" else
                     int(needs.split()[0].replace("a", "1")))
              for name, cls, needs in rows}
    corpus = _corpus()
    assert sorted(listed) == sorted(corpus), (
        f"docs/conformance.md lists {sorted(set(listed) - set(corpus))} that the corpus lacks "
        f"and lacks {sorted(set(corpus) - set(listed))}")
    wrong = [n for n in corpus if listed[n] != corpus[n]]
    assert not wrong, f"failure class or GPU need differs from the module's for {wrong}"


def test_conformance_md_lists_the_clauses_the_plugin_judges():
    from dcp_a2a.testing.plugin import CLAUSES

    text = (ROOT / "docs" / "conformance.md").read_text()
    section = text.split("## Contract clauses", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| ([a-z][a-z -]*[a-z]) \| ", section, re.M)[1:]  # after the head
    assert listed == list(CLAUSES), f"docs/conformance.md's clauses {listed} are not the " \
                                    f"plugin's {list(CLAUSES)}"
