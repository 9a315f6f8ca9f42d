"""The scripts in benchmarks/ run end to end on tiny rows (the interpreter on a CPU) and report
every part they promise: the comparison with vLLM's kernels (a stand-in engine file here, the
real release on the GPU machine) and the decode rows against the engine design with the
unpack's candidate launches. Structure only: the
speeds are the GPU's to measure, never here."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

from dcp_a2a.testing import eager

pytestmark = pytest.mark.kernel

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script(name):
    """benchmarks/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A stand-in for vLLM's dcp.py: the definitions the comparison reads from it, by name, here our
# own ops (the real file is vLLM's, read at run time on the GPU machine).
_STAND_IN = '''
import vllm  # the rest of the real file imports the engine: the script must not run it


def _validate_dcp_empty_shard_args(seq_lens, query_start_loc):
    return False


@triton.jit
def _dcp_a2a_pack_send_kernel(x):
    pass


@triton.jit
def _dcp_a2a_unpack_combine_kernel(x):
    pass


def _dcp_a2a_pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim):
    import dcp_a2a
    dcp_a2a.pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim)


def _dcp_a2a_unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
    import dcp_a2a
    return dcp_a2a.unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)
'''


def _wheel(tmp_path, text=_STAND_IN):
    """A wheel holding ``text`` as vLLM's dcp.py, with its version in METADATA."""
    wheel = tmp_path / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/v1/attention/ops/dcp.py", text)
        z.writestr("vllm-0.34.0.dist-info/METADATA", "Name: vllm\nVersion: 0.34.0\n")
    return wheel


def test_the_comparison_with_vllm_smoke_run_writes_its_report(tmp_path, capsys):
    """--smoke from vLLM's wheel: every part of the report (the decode rows' verdicts for both
    ops, the large rows, B=1's sum), the run (card, commit) in the file, the tables in the .md
    beside it; a folder as OUT gets the card's file; the stand-in's own imports never run."""
    cmp = _script("benchmark_combine_vs_vllm")
    out = tmp_path / "results"
    assert cmp.main([str(_wheel(tmp_path)), str(out), "--smoke"]) == 0
    (path,) = out.glob("*.json")  # the card's file: cpu.json here, h100.json on an H100
    report = json.loads(path.read_text())
    assert report["vllm"]["version"] == "0.34.0" and report["run"]["commit"]
    assert path.stem == cmp.card_stem(report["run"]["card"]) and report["rounds"] == 2
    (row,) = report["decode"]
    for op in ("unpack", "pack"):
        assert set(row[op]["times_us"]) == {"ours", "vllm", "copy"}
        assert len(row[op]["times_us"]["ours"]) == 2 and row[op]["target"] == cmp.TARGETS[op]
        assert row[op]["verdict"] in ("met", "floor", "not met") and len(row[op]["interval"]) == 2
    (large,) = report["large"]
    assert large["pack"]["verdict"] == "not timed"  # no copy bandwidth on the CPU
    assert report["b1"]["target_us"] == cmp.B1_US and report["b1"]["verdict"] in (
        "met", "missed", "undecided")
    md = path.with_suffix(".md").read_text()
    assert md.startswith(f"# combine_vs_vllm on {report['run']['card']}") and "- command: `python benchmarks/" in md
    assert "| B | H | D | N | dtype | unpack us" in md and "B=1 (" in md
    assert md.split("\n\n", 2)[2].strip() in capsys.readouterr().out  # the tables, printed
    assert [cmp.card_stem(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "CPU (x86_64)",
                                       "NVIDIA A100-SXM4-80GB")] == ["h100", "h200", "cpu",
                                                                     "a100"]


def test_the_comparison_reads_vllms_file_or_tree_and_names_what_it_lacks(tmp_path):
    cmp = _script("benchmark_combine_vs_vllm")
    file = tmp_path / "dcp.py"
    file.write_text(_STAND_IN)
    assert callable(cmp.load_engine(file)._dcp_a2a_unpack_combine)
    tree = tmp_path / "tree" / "vllm" / "v1" / "attention" / "ops"
    tree.mkdir(parents=True)
    (tree / "dcp.py").write_text(_STAND_IN)
    assert callable(cmp.load_engine(tmp_path / "tree")._dcp_a2a_pack_send)
    lacking = _wheel(tmp_path, _STAND_IN.replace("def _dcp_a2a_pack_send(", "def other("))
    with pytest.raises(ValueError, match=r"defines no _dcp_a2a_pack_send\b"):
        cmp.load_engine(lacking)
    with pytest.raises(SystemExit):
        cmp.main([str(file), str(tmp_path), "--rounds", "1"])


def test_the_decode_rows_against_the_engine_design_run_on_the_cpu(tmp_path, capsys):
    """benchmarks/benchmark_decode_vs_engine_design.py --smoke: tiny shapes in the interpreter,
    every part of the report and both tables (the GPU run is the measurement)."""
    probe = _script("benchmark_decode_vs_engine_design")
    assert len(probe.ROWS) == 17 and len(probe.REPORTED_VLLM_US) == 17
    out = tmp_path / "probe.json"
    assert probe.main([str(out), "--smoke"]) == 0
    report = json.loads(out.read_text())
    assert [(r["B"], r["dtype"]) for r in report["graph"]] == [(2, "float16")]
    for r in report["graph"]:
        assert {"ours", "engine", "sf", "head_w1"} <= set(r["times_us"])
        assert r["verdict"] in ("met", "missed", "undecided") and len(r["ci"]) == 2
    assert "elements" in report["graph"][0]["times_us"]  # 16-bit, even D: words or lanes
    assert [r["op"] for r in report["eager"]] == list(eager.OPS)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].startswith("eager: 1 back-to-back calls")
    assert any(line.startswith("ratios: medians of the per-round ratios") for line in printed)


def test_the_decode_probe_takes_a_grids_points_slower_than_the_engine(tmp_path):
    """--from-grid: the points of a grid's JSON not met against the engine design at or above
    --min-ratio, worst first; no eager part and no fma run (tiny points, the interpreter)."""
    probe = _script("benchmark_decode_vs_engine_design")

    def point(b, ratio, verdict):
        return {"B": b, "H": 4, "D": 8, "N": 2, "dtype": "float16",
                "unpack_engine_ratio": ratio, "unpack_engine_verdict": verdict}

    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"grid": [point(1, 1.02, "missed"), point(2, 0.90, "met"),
                                         point(3, 1.10, "undecided"), point(4, 0.99, "missed"),
                                         point(5, 1.05, "met")]}))
    assert [p[0] for p in probe.grid_misses(grid, 1.0)] == [3, 1]
    assert [p[0] for p in probe.grid_misses(grid, 0.98)] == [3, 1, 4]
    out = tmp_path / "probe.json"
    assert probe.main([str(out), "--smoke", "--from-grid", str(grid)]) == 0
    report = json.loads(out.read_text())
    assert [r["B"] for r in report["graph"]] == [3, 1] and report["eager"] == []
    assert all("fma" not in r["times_us"] and "head_w2" in r["times_us"]
               for r in report["graph"])


def test_the_decode_probe_takes_a_grids_points_whose_launch_changed(tmp_path, monkeypatch):
    """--changed-from TABLE: the grid's points whose combine launch TABLE chose otherwise than
    the table in force (compiled rules), worst against the engine design first, each with
    TABLE's launch; the smoke run times it beside ours as "was"."""
    from dcp_a2a.kernels import tuning

    probe = _script("benchmark_decode_vs_engine_design")

    def point(b, h, d, n, dtype, ratio):
        return {"B": b, "H": h, "D": d, "N": n, "dtype": dtype, "unpack_engine_ratio": ratio}

    pts = [point(1, 64, 128, 8, "bfloat16", 1.0), point(32, 128, 128, 8, "bfloat16", 1.1),
           point(64, 128, 512, 8, "bfloat16", 0.9), point(8192, 64, 512, 4, "bfloat16", 0.8)]
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"grid": pts}))
    monkeypatch.setattr(tuning._env, "INTERPRET", False)
    monkeypatch.setattr(tuning, "ACTIVE", tuning.H200.rules)  # the rules this test states
    other = {**tuning.H200.rules, "combine": (tuning.Rule(float("inf"), 512, 1, 1),)}
    monkeypatch.setitem(tuning.CANDIDATES, "one_warp", other)
    monkeypatch.setitem(tuning.CANDIDATES, "h200", tuning.H200.rules)
    changed = probe.grid_changed(grid, "one_warp")
    want = [p for p in sorted(pts, key=lambda p: -p["unpack_engine_ratio"])
            if tuning.combine_launch(p["N"], p["B"], p["H"] // p["N"], p["D"] // 2)
            != tuning.Launch(1, 256 if p["D"] == 512 else 64, 1)]
    assert [c[0][0] for c in changed] == [p["B"] for p in want] and len(want) >= 2
    assert all(was == tuning.Launch(1, 256 if pt[2] == 512 else 64, 1) for pt, was in changed)
    assert probe.grid_changed(grid, "h200") == []  # the table in force against itself
    monkeypatch.setattr(tuning._env, "INTERPRET", True)
    monkeypatch.setattr(probe, "grid_changed",
                        lambda path, name: [((2, 4, 8, 2, "float16"), tuning.Launch(1, 4, 1))])
    out = tmp_path / "probe.json"
    assert probe.main([str(out), "--smoke", "--from-grid", str(grid),
                       "--changed-from", "one_warp"]) == 0
    report = json.loads(out.read_text())
    assert [set(r["times_us"]) for r in report["graph"]] == [{"ours", "engine", "sf", "was"}]


def test_launch_invariance_compiles_counts_the_grid(tmp_path, capsys):
    """The count of the launch-invariance grid's specialisations, on one small case: every
    kernel the backends launch is counted, the LSE base splits the combines and not the
    packs, and a nonsense group size is refused."""
    script = _script("benchmark_launch_invariance_compiles")
    out = tmp_path / "counts.json"
    assert script.main([str(out), "--shapes", "2x8x24", "--groups", "2"]) == 0
    data = json.loads(out.read_text())
    kernels = set(data["per_kernel"])
    assert {"_pack_kernel", "combine_rows", "_pack_to_peers_kernel",
            "_combine_from_peers_kernel", "_scale_kernel"} <= kernels
    assert data["total"] == sum(data["per_kernel"].values())
    by_base = data["added_by"]["base"]
    assert by_base.get("combine_rows 2", 0) > 0 and by_base.get("combine_rows e", 0) > 0
    assert "_pack_kernel 2" not in by_base  # the pack takes no base: base 2 adds none
    assert "| all |" in capsys.readouterr().out
    assert data["run"]["command"].startswith("python benchmarks/benchmark_launch_invariance")
    for bad in (["--groups", "0"], ["--groups", "two"], ["--shapes", "2x8"]):
        with pytest.raises(SystemExit):
            script.main(bad)
