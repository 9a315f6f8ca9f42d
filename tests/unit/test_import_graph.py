"""The installed package imports nothing of the project's tests, and the evals' modules import
one another without a circle. Read from the source with ``ast`` (every import statement,
including those inside functions: a deferred import is still an edge), so no module is run.

The installed names (pyproject's package-dir): dcp_a2a/ is ``dcp_a2a``, evals/ is
``dcp_a2a.evals``, reference/ is ``dcp_a2a.reference``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"dcp_a2a": ROOT / "dcp_a2a", "dcp_a2a.evals": ROOT / "evals",
            "dcp_a2a.reference": ROOT / "reference"}


def _modules() -> dict[str, Path]:
    """Every installed module's dotted name and file."""
    out = {}
    for prefix, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([prefix, *parts])] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The dotted names ``name``'s file imports (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[:len(base) - node.level + 1]
                mod = ".".join(anchor + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # from pkg import module
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_the_graph_covers_the_package():
    assert {"dcp_a2a.ops", "dcp_a2a.evals.model", "dcp_a2a.evals.dequantised",
            "dcp_a2a.reference.contract"} <= set(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_package_imports_no_tests(name):
    bad = sorted(m for m in GRAPH[name] if m == "tests" or m.startswith("tests."))
    assert not bad, f"{MODULES[name].relative_to(ROOT)} imports {bad}: the product ships " \
                    "without tests/"


def _cycle(nodes: set[str]) -> list[str] | None:
    """A cycle among ``nodes`` in GRAPH (edges to modules of ``nodes`` only), or None."""
    edges = {n: sorted(m for m in GRAPH[n] if m in nodes and m != n) for n in nodes}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in edges[n]:
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(nodes):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_evals_modules_import_without_a_circle():
    evals = {n for n in MODULES if n.startswith("dcp_a2a.evals.")}
    found = _cycle(evals)
    assert found is None, "an import circle: " + " -> ".join(found)


def test_the_cycle_finder_finds_one():
    """The check is not vacuous: an edge back from the loader to the module that imports it is
    reported."""
    saved = set(GRAPH["dcp_a2a.evals.registry"])
    GRAPH["dcp_a2a.evals.registry"].add("dcp_a2a.evals.dequantised")
    try:
        found = _cycle({"dcp_a2a.evals.registry", "dcp_a2a.evals.dequantised"})
    finally:
        GRAPH["dcp_a2a.evals.registry"] = saved
    assert found and found[0] == found[-1]
