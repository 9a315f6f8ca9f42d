"""``dcp-a2a engines``' table (dcp_a2a.testing.engines): each cell says passed, failed by
severity, not applicable or outside the envelope; defects come first in each engine's section,
each failing clause with its reproducer."""

from __future__ import annotations

import pytest

from dcp_a2a.testing.engines import EngineRun, cell, render_markdown
from dcp_a2a.testing.verdicts import SEVERITIES

pytestmark = pytest.mark.unit


def _row(clause, passed=0, failed=None, na=0, outside=0, why=()):
    return {"clause": clause, "passed": passed,
            "failed": {s: (failed or {}).get(s, 0) for s in SEVERITIES},
            "not_applicable": na, "not_applicable_why": list(why), "outside": outside,
            "outside_why": [], "limits": [], "skipped": 0,
            "judged": passed + sum((failed or {}).values())}


def test_cells():
    assert cell(_row("merge bound", passed=40)) == "passed (40)"
    assert cell(_row("merge bound", passed=40, outside=3)) == "passed (40; 3 outside envelope)"
    got = cell(_row("masking", passed=3, failed={"convention": 2, "defect": 1}))
    assert got == "**failed**: 1 defect, 2 conventions (of 6)"
    assert cell(_row("exchange", na=5, why=["exchange"])) == "not applicable: exchange"
    assert cell(None) == "not run"


def test_the_markdown_leads_with_defects_and_shows_reproducers():
    run = EngineRun(spec="vllm=/x/vllm.whl", name="vllm (release)", status="ran",
                    described="vLLM 0.34.0 (wheel /x/vllm.whl)", surfaces=["merge", "wire"],
                    envelope="head dims: power of two", exit_status=1, wall_s=12.0)
    run.clauses = {"masking": _row("masking", passed=5, failed={"defect": 2}),
                   "merge bound": _row("merge bound", passed=9, failed={"precision": 1})}
    run.worst = {"masking": {"nodeid": "t::strided", "severity": "defect", "why": "wrong result",
                             "message": "12 of 72 wire words differ", "clause": "masking",
                             "repro": "impl.pack_send(...)\n"}}
    run.defects = [run.worst["masking"]]
    other = EngineRun(spec="sglang:fi_a2a", name="sglang:fi_a2a", status="not run",
                      reason="needs >= 2 CUDA GPUs")
    md = render_markdown([run, other], "CPU")
    assert "| masking | **failed**: 2 defects (of 7) |" in md
    assert "| merge bound | **failed**: 1 precision (of 10) |" in md
    assert "`sglang:fi_a2a`: needs >= 2 CUDA GPUs" in md
    assert md.index("**Defects (1)**") < md.index("```python")
    assert "impl.pack_send(...)" in md
