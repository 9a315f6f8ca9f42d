"""The README's runnable example runs and prints what it says (docs that cannot rot)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_fifteen_line_example_runs():
    section = README.read_text().split("## In 15 lines", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert len(code.strip().splitlines()) <= 15
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {})
    assert printed.getvalue().strip() == "torch.Size([3, 2, 64]) torch.Size([3, 2])"


ROOT = README.parent
TEXT = README.read_text()


def _section(title: str) -> str:
    return TEXT.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_quickstart_is_two_commands_and_the_second_is_ci():
    block = re.findall(r"```bash\n(.*?)```", _section("Quickstart"), re.S)[0]
    lines = [ln for ln in block.strip().splitlines() if ln.strip()]
    assert len(lines) == 2, lines
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert lines[1] == ci, "the README's test command and .ci/run must be the same line"
    assert lines[0].endswith(".venv/bin/dcp-a2a validate")


def test_what_the_readme_says_quick_runs_is_what_it_runs():
    """The README's --quick sentence names the quick tiers of validate.py and what the
    recorder keeps of them (one case of a project test function, every case of a conformance
    test)."""
    from dcp_a2a.testing import validate

    said = TEXT.split("`dcp-a2a validate --quick` is", 1)[1].split("The second runs", 1)[0]
    said = " ".join(said.split())
    tiers = re.search(r"the (\w+), (\w+) and (\w+) tiers", said)
    assert tiers and tiers.groups() == validate.QUICK_TIERS, said
    assert "without slow tests" in said
    assert "one case of each of the project's own test functions" in said
    assert "every case of each conformance test" in said
    recorder = (ROOT / "dcp_a2a" / "testing" / "recorder.py").read_text()
    assert 'if "slow" in marks:' in recorder and '"conformance" not in tiers' in recorder


def test_validate_your_engine_installs_from_a_checkout_or_a_wheel():
    section = _section("Validate your engine")
    first = re.findall(r"```bash\n(.*?)```", section, re.S)[0].strip()
    assert "dcp-a2a[test]" not in section.replace("dcp_a2a-*.whl)[test]", ""), \
        "no package index has dcp-a2a: install from a checkout or a built wheel"
    assert first == "python -m pip install -e '.[test]'"
    assert "pip wheel --no-deps . -w dist" in section and "dist/dcp_a2a-*.whl)[test]" in section
    assert "--impl vllm=" in section and "pip download --no-deps vllm==" in section


def test_the_adapter_example_defines_the_impl_the_docs_name():
    """The docs show `--impl my_adapter:IMPL`; the worked adapter defines that IMPL, and both
    of its forms load as the same implementation."""
    from dcp_a2a.reference import adapter_example
    from dcp_a2a.testing.impl import load_impl

    docs = TEXT + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    assert ":IMPL" in docs
    assert "reference/adapter_example.py" in _section("Validate your engine")
    assert isinstance(adapter_example.IMPL, adapter_example.EngineAdapter)
    by_instance = load_impl("dcp_a2a.reference.adapter_example:IMPL")
    by_module = load_impl("dcp_a2a.reference.adapter_example")
    assert by_instance.missing() == by_module.missing() == []
    assert by_instance.surfaces == by_module.surfaces
