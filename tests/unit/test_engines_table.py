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


def test_a_report_renders_into_its_place_in_a_doc_and_nowhere_else(tmp_path, capsys):
    """--from-report --doc: the table goes between the markers of the machine it ran on
    (reproducers left in the report folder), replaces what was there, leaves the rest of the
    doc alone; a doc without the markers is a usage error before any work."""
    import json
    from dataclasses import asdict

    from dcp_a2a.testing import cli

    run = EngineRun(spec="vllm=/x/vllm.whl", name="vllm (release)", status="ran",
                    described="vLLM 0.34.0", surfaces=["wire"], wall_s=1.0)
    run.clauses = {"masking": _row("masking", passed=1, failed={"defect": 1})}
    run.worst = {"masking": {"nodeid": "t::strided", "severity": "defect", "why": "wrong result",
                             "message": "12 of 72 wire words differ", "clause": "masking",
                             "repro": "impl.pack_send(...)\n"}}
    report = tmp_path / "engines.json"
    report.write_text(json.dumps({"machine": "CPU, Triton 3.8.0 interpreter",
                                  "runs": [asdict(run)]}))
    doc = tmp_path / "engines.md"
    doc.write_text("# Results\n<!-- engines table: CPU -->\nold\n<!-- end of the engines table: "
                   "CPU -->\nafter\n<!-- engines table: GPU -->\n<!-- end of the engines table:"
                   " GPU -->\n")
    for _ in range(2):  # a second write replaces the first
        assert cli.main(["engines", "--from-report", str(report), "--doc", str(doc)]) == 0
    text = doc.read_text()
    cpu = text.split("<!-- engines table: CPU -->")[1].split("<!-- end of the engines table")[0]
    assert "| masking | **failed**: 1 defect (of 2) |" in cpu and "old" not in text
    assert text.count("## Engine x clause") == 1 and "impl.pack_send" not in text
    assert text.endswith("after\n<!-- engines table: GPU -->\n<!-- end of the engines table: "
                         "GPU -->\n")
    bare = tmp_path / "bare.md"
    bare.write_text("# no place for a table\n")
    capsys.readouterr()
    assert cli.main(["engines", "--from-report", str(report), "--doc", str(bare)]) == 2
    assert "argument --doc" in capsys.readouterr().err and bare.read_text() == \
        "# no place for a table\n"


def test_reports_of_one_engine_each_render_as_one_table(tmp_path, capsys):
    """--from-report with several reports (engines run one at a time): one table, a column
    each; reports of different machines, or one engine twice, are a usage error."""
    import json
    from dataclasses import asdict

    from dcp_a2a.testing import cli

    def report(name, spec, machine="1 x NVIDIA H200, torch 2.11.0"):
        run = EngineRun(spec=spec, name=spec, status="ran", described=spec, surfaces=["wire"],
                        wall_s=1.0)
        run.clauses = {"masking": _row("masking", passed=2)}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"machine": machine, "runs": [asdict(run)]}))
        return str(path)

    one, two = report("one", "vllm=/w/v.whl"), report("two", "sglang=/w/s.whl")
    capsys.readouterr()
    assert cli.main(["engines", "--from-report", one, two]) == 0
    md = capsys.readouterr().out
    header = next(line for line in md.splitlines() if line.startswith("| clause"))
    assert "vllm=/w/v.whl" in header and "sglang=/w/s.whl" in header
    cpu = report("cpu", "flashinfer=/w/f.whl", machine="CPU, Triton 3.8.0 interpreter")
    assert cli.main(["engines", "--from-report", one, cpu]) == 2
    assert "one table holds one machine's runs" in capsys.readouterr().err
    assert cli.main(["engines", "--from-report", one, report("again", "vllm=/w/v.whl")]) == 2
    assert "vllm=/w/v.whl is in both" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("[]")
    assert cli.main(["engines", "--from-report", str(tmp_path / "junk.json")]) == 2
    assert "not an engines.json" in capsys.readouterr().err
