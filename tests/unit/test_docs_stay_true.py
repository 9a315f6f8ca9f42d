"""The user docs say how to use the suite in words that stay true: no commit hashes and no
tracker numbers in them (a reader outside this repository's history can use neither), and the
mutant corpus docs/conformance.md lists is the corpus that ships. Counts and times the docs show
come from docs/results (tests/unit/test_results.py) or are checked here."""

from __future__ import annotations

import ast
import os
import re
import sys
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


SOURCES = sorted(p for ext in ("py", "yaml", "toml", "sh", "md") for p in ROOT.glob(f"**/*.{ext}")
                 if not {".venv", "build", "validation-report", ".git"} & set(p.relative_to(ROOT).parts)
                 and "egg-info" not in str(p))


def test_no_source_names_a_tracker_number():
    """Code, comments and docstrings say what a thing does and why; a tracker number tells a
    reader outside this repository's history nothing."""
    found = {str(p.relative_to(ROOT)): hits for p in SOURCES if p != Path(__file__)
             for hits in [sorted(set(TRACKER.findall(p.read_text(errors="replace"))))] if hits}
    assert not found, f"tracker numbers in {found}: say what the thing does"


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


# The adapters docs/conformance.md shows for an engine with only a merge and one with only an
# exchange, run against stand-ins of the engine functions they call: they load, expose the
# surface the docs say, declare the envelope the docs say, and call the engine as written.
STAND_IN_ENGINE = {
    "__init__.py": "",
    "ops.py": '''
import math

import torch


def merge_states(v, s):
    """v[B, N, H, D], s[B, N, H] base-2 LSEs -> (v[B, H, D], s[B, H] float64)."""
    if v.shape[-1] & (v.shape[-1] - 1):
        raise RuntimeError("arange's range must be a power of 2")
    lse = torch.logsumexp(s.double() * math.log(2), 1) / math.log(2)
    out = (torch.exp2(s.double() - lse[:, None])[..., None] * v.double()).sum(1)
    return out.to(v.dtype), lse
''',
    "distributed.py": '''
CALLS = []


def dcp_reduce(out, lse, process_group, natural_base=True):
    CALLS.append((out, lse, process_group, natural_base))
    return out
''',
}


def _doc_code(doc: str, heading: str) -> str:
    section = (ROOT / "docs" / doc).read_text().split(heading, 1)[1]
    return re.findall(r"```python\n(.*?)```", section, re.S)[0]


@pytest.fixture
def stand_in_engine(tmp_path, monkeypatch):
    """``my_engine`` importable from ``tmp_path``; the modules the test imports forgotten after."""
    pkg = tmp_path / "my_engine"
    pkg.mkdir()
    for name, text in STAND_IN_ENGINE.items():
        (pkg / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("my_engine", "merge_adapter", "exchange_adapter"):
            del sys.modules[name]


def test_the_merge_only_adapter_of_the_docs(stand_in_engine):
    import torch

    from dcp_a2a.testing.compare import check_merge
    from dcp_a2a.testing.data import partials
    from dcp_a2a.testing.impl import load_impl
    from dcp_a2a.testing.surfaces import Unsupported

    path = stand_in_engine / "merge_adapter.py"
    path.write_text(_doc_code("conformance.md", "### An engine that exposes only a merge"))
    impl = load_impl(str(path))
    assert impl.surfaces == {"merge"}
    assert impl.envelope.describe() == "head dims: power of two only; LSE bases: 2"
    assert impl.envelope.said.get("head_dims")
    outs, lses = partials(3, 4, 2, 16, torch.bfloat16, seed=1)
    out, lse = impl.merge(outs, lses, is_lse_base_on_e=False, return_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    rep = check_merge(out, lse, outs, lses, is_lse_base_on_e=False)
    assert rep.ok, rep.describe()
    assert torch.equal(impl.merge(outs, lses, is_lse_base_on_e=False), out)
    with pytest.raises(Unsupported, match="base-e"):
        impl.merge(outs, lses, is_lse_base_on_e=True)


def test_the_exchange_only_adapter_of_the_docs(stand_in_engine):
    import torch

    from dcp_a2a.testing.impl import load_impl
    from dcp_a2a.testing.surfaces import Unsupported

    path = stand_in_engine / "exchange_adapter.py"
    path.write_text(_doc_code("conformance.md", "### An engine that exposes only an exchange"))
    impl = load_impl(str(path))
    assert impl.surfaces == {"exchange"}
    assert impl.envelope.describe() == "world sizes: at least 2"

    class Group:
        world_size, rank_in_group, device_group = 2, 1, object()

    out, lse = torch.randn(3, 4, 8), torch.randn(3, 4)
    with pytest.raises(Unsupported, match="LSE"):
        impl.lse_reduce(out, lse, Group(), return_lse=True)
    from my_engine.distributed import CALLS

    assert not CALLS
    assert impl.lse_reduce(out, lse, Group(), is_lse_base_on_e=False) is out
    assert CALLS == [(out, lse, Group.device_group, False)]


def test_engines_md_keeps_a_place_for_each_results_table():
    """The engines tables are generated from real runs into these places, never written by
    hand around them."""
    text = (ROOT / "docs" / "engines.md").read_text()
    for where in ("CPU", "GPU"):
        assert text.count(f"<!-- engines table: {where} -->") == 1, where
