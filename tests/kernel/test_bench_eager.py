"""The benchmark's eager-call timing (dcp_a2a.testing.eager, issue 47) runs end to end and reports
every op it promises, with the floors' empty kernels launched with the very arguments of the real
launches. Structure only: on the CPU the kernels run in Triton's interpreter and the times mean
nothing (speed is claimed by the GPU benchmark, never here)."""

from __future__ import annotations

import inspect
import json

import pytest

from dcp_a2a.testing import eager

pytestmark = pytest.mark.kernel


def test_eager_rows_report_every_op_and_their_floors(device):
    rows = eager.eager_rows(1, 4, 6, 2, "float16", device, calls=2, repeats=2)
    assert [r["op"] for r in rows] == list(eager.OPS)
    for r in rows:
        assert r["shape"] == "B=1 H=4 D=6 N=2 float16" and (r["calls"], r["repeats"]) == (2, 2)
        assert len(r["runs_us"]) == 2 and r["us"] > 0 and all(t > 0 for t in r["runs_us"])
    by_op = {r["op"]: r for r in rows}
    for op, floors in (("pack_send", ["floor_pack"]), ("unpack_combine", ["floor_unpack"]),
                       ("engine_unpack", ["floor_engine_unpack"]),
                       ("lse_reduce_n1", ["floor_pack", "floor_unpack"])):
        want = by_op[op]["us"] - sum(by_op[f]["us"] for f in floors)
        assert by_op[op]["over_floor_us"] == pytest.approx(want)
    assert by_op["floor_pack"]["over_floor_us"] is None
    json.dumps(rows)  # the bench writes them into its JSON report
    text = eager.eager_table(rows)
    assert all(op in text for op in eager.OPS) and "2 back-to-back calls" in text


def test_the_floors_launch_twins_of_the_real_kernels():
    """Each empty twin has its kernel's parameters (names and which are constexprs), so that
    it is launched exactly as the real kernel is."""
    def params(k):
        return [(p.name, p.annotation) for p in inspect.signature(k.fn).parameters.values()]

    for (mod, name), twin in eager.twins().items():
        assert params(twin) == params(getattr(mod, name)), name


def test_capture_launch_records_one_launch_and_runs_nothing(device):
    import torch

    import dcp_a2a
    from dcp_a2a.kernels import combine

    recv = torch.zeros(2, 1, 2, 10, dtype=torch.float16, device=device)  # D = 8, P = 2
    kernel = combine.combine_rows
    twin, grid, args, kw = eager.capture_launch(
        lambda: dcp_a2a.unpack_combine(recv, 8, 2, False, True))
    assert twin is eager._empty_combine and combine.combine_rows is kernel  # restored
    assert kw["N"] == 2 and len(args) == 19 and len(grid) == 2  # ... + the output's 3 strides


def _perf_script(name):
    """docs/perf_data/<name>.py as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "perf_data" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _issue47_probe():
    return _perf_script("issue47_probe")


def test_issue47_probe_runs_on_the_cpu(tmp_path, capsys):
    """docs/perf_data/issue47_probe.py --smoke: tiny shapes in the interpreter, every part of
    the report and both tables (the GPU run is the measurement)."""
    probe = _issue47_probe()
    assert len(probe.ROWS) == 17
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


def test_issue47_probe_takes_a_grids_points_slower_than_the_engine(tmp_path):
    """--from-grid: the points of a grid's JSON not met against the engine design at or above
    --min-ratio, worst first; no eager part and no fma run (tiny points, the interpreter)."""
    probe = _issue47_probe()

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


def test_issue47_probe_takes_a_grids_points_whose_launch_changed(tmp_path, monkeypatch):
    """--changed-from TABLE: the grid's points whose combine launch TABLE chose otherwise than
    the table in force (compiled rules), worst against the engine design first, each with
    TABLE's launch; the smoke run times it beside ours as "was"."""
    from dcp_a2a.kernels import tuning

    probe = _issue47_probe()

    def point(b, h, d, n, dtype, ratio):
        return {"B": b, "H": h, "D": d, "N": n, "dtype": dtype, "unpack_engine_ratio": ratio}

    pts = [point(1, 64, 128, 8, "bfloat16", 1.0), point(32, 128, 128, 8, "bfloat16", 1.1),
           point(64, 128, 512, 8, "bfloat16", 0.9), point(8192, 64, 512, 4, "bfloat16", 0.8)]
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"grid": pts}))
    monkeypatch.setattr(tuning._env, "INTERPRET", False)
    other = {**tuning.TABLE, "combine": (tuning.Rule(float("inf"), 512, 1, 1),)}
    monkeypatch.setitem(tuning.CANDIDATES, "one_warp", other)
    changed = probe.grid_changed(grid, "one_warp")
    want = [p for p in sorted(pts, key=lambda p: -p["unpack_engine_ratio"])
            if tuning.combine_launch(p["N"], p["B"], p["H"] // p["N"], p["D"] // 2)
            != tuning.Launch(1, 256 if p["D"] == 512 else 64, 1)]
    assert [c[0][0] for c in changed] == [p["B"] for p in want] and len(want) >= 2
    assert all(was == tuning.Launch(1, 256 if pt[2] == 512 else 64, 1) for pt, was in changed)
    assert probe.grid_changed(grid, "table") == []  # the table in force against itself
    monkeypatch.setattr(tuning._env, "INTERPRET", True)
    monkeypatch.setattr(probe, "grid_changed",
                        lambda path, name: [((2, 4, 8, 2, "float16"), tuning.Launch(1, 4, 1))])
    out = tmp_path / "probe.json"
    assert probe.main([str(out), "--smoke", "--from-grid", str(grid),
                       "--changed-from", "one_warp"]) == 0
    report = json.loads(out.read_text())
    assert [set(r["times_us"]) for r in report["graph"]] == [{"ours", "engine", "sf", "was"}]


# A stand-in for vLLM's dcp.py: the definitions the side-by-side probe reads from it, by name,
# here our own ops (the real file is vLLM's, read at run time on the GPU machine).
_STAND_IN = '''
import vllm  # the rest of the real file imports the engine: the probe must not run it


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


def _side_by_side():
    return _perf_script("vllm_side_by_side")


def test_vllm_side_by_side_runs_on_the_cpu(tmp_path, capsys):
    """docs/perf_data/vllm_side_by_side.py --smoke with a stand-in engine file: only the named
    definitions are loaded (the file's own imports are not run), every part of the report."""
    sbs = _side_by_side()
    engine_file = tmp_path / "dcp.py"
    engine_file.write_text(_STAND_IN)
    out = tmp_path / "sbs" / "sbs.json"
    assert sbs.main([str(engine_file), str(out), "--smoke"]) == 0
    report = json.loads(out.read_text())
    (row,) = report["graph"]
    assert set(row["times_us"]) == {"ours", "engine", "vllm"} and row["rounds"] == 2
    assert isinstance(row["engine_equals_vllm_bitwise"], bool)
    assert [r["op"] for r in report["eager"]] == ["pack_send", "vllm_pack", "unpack_combine",
                                                  "vllm_unpack", "engine_unpack"]
    assert report["eager"][0]["over_vllm"] > 0 and report["eager"][1]["over_vllm"] is None
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].startswith("eager: 1 back-to-back calls")


def test_vllm_side_by_side_names_what_the_engine_file_lacks(tmp_path):
    sbs = _side_by_side()
    engine_file = tmp_path / "dcp.py"
    engine_file.write_text(_STAND_IN.replace("def _dcp_a2a_pack_send(", "def other("))
    with pytest.raises(ValueError, match="does not define _dcp_a2a_pack_send "):
        sbs.load_engine(engine_file, tmp_path)


_PTX = """//
// Generated by LLVM NVPTX Back-End
.visible .entry {name}(
\t.param .u64 .ptr .global .align 1 {name}_param_0
)
{{
\t.reg .b32 \t%r<{n}>;
\t.loc\t1 52 0
\tld.param.b64 \t%rd{n}, [{name}_param_0];
\tmov.u32 \t%r{n}, %tid.x;
\t{op} \t%r{n}, %r{n}, 127;
\tret;
}}
\t.section\t.debug_abbrev
\t{{ .b8 {n} }}
"""


def test_engine_ptx_diff_compares_code_only():
    """docs/perf_data/engine_ptx_diff.py's normalisation: register numbers, the kernel's name,
    line records and the debug sections do not count; an instruction does."""
    ptx_diff = _perf_script("engine_ptx_diff")
    a = ptx_diff.instructions(_PTX.format(name="_a_kernel", n=3, op="and.b32"), "_a_kernel")
    b = ptx_diff.instructions(_PTX.format(name="_b", n=7, op="and.b32"), "_b")
    c = ptx_diff.instructions(_PTX.format(name="_b", n=7, op="or.b32"), "_b")
    assert a == b and len(a) == 8
    assert a != c and [x for x in c if x not in a] == ["or.b32 \t%r, %r, 127;"]
