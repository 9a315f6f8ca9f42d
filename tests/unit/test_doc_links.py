"""The docs' relative links resolve (a file, and a heading where the link names an anchor), and
docs/perf.md stays the current state and docs/perf_history.md a short history (perf.md had once
grown to a 16k-word log of every pass)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(md: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces
    to hyphens)."""
    out = set()
    for line in md.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # not links in code
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{doc.name}: links that resolve to nothing: {broken}"


def test_perf_md_is_the_current_state_and_links_its_history():
    perf = (ROOT / "docs" / "perf.md").read_text()
    assert len(perf.split()) < 3000, "docs/perf.md is the current state; passes go to history"
    assert "[perf_history.md](perf_history.md)" in perf
    history = (ROOT / "docs" / "perf_history.md").read_text()
    # a few lines a pass, lessons only: the raw tables live in git and in docs/results
    assert len(history.split()) < 3000, "docs/perf_history.md is a short history"
    assert not re.search(r"^\|.*\|$", history, flags=re.M), "tables of numbers go to results"
