"""benchmarks/: every script answers ``--help`` on any machine and is listed, with its results,
in benchmarks/README.md; the cheap ones run (the host-overhead benchmark with a few calls on the
CPU, the recorder around a command) and leave a result that says where it comes from."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.unit.test_documented_commands import load_script

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
README = (BENCHMARKS / "README.md").read_text()


def test_the_benchmarks_are_named_for_what_they_measure():
    assert len(SCRIPTS) >= 15
    for name in SCRIPTS:
        assert re.fullmatch(r"(benchmark_[a-z0-9_]+|diff_engine_ptx|record|results)\.py", name), \
            name
        assert not re.search(r"issue|pass|\d{2,}", name), f"{name}: named for a tracker entry"


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_works_on_any_machine(name, capsys):
    mod = load_script(f"benchmarks/{name}")
    with pytest.raises(SystemExit) as done:
        mod.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.startswith(f"usage: python benchmarks/{name}"), out[:200]


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_readme_lists_every_script(name):
    assert f"`{name}" in README or f"benchmarks/{name}" in README or \
        f"`{name.removesuffix('.py')}" in README, f"benchmarks/README.md does not list {name}"


def test_the_readme_names_every_results_folder():
    folders = {p.parent.name for p in (ROOT / "docs" / "results").glob("*/*.json")}
    perf = {f for f in folders if not f.startswith(("gsm8k", "logit_parity", "eval_"))}
    missing = sorted(f for f in perf if f"`{f}/`" not in README)
    assert not missing, f"benchmarks/README.md does not name the results of {missing}"


def test_host_overhead_runs_and_records_its_run(tmp_path, capsys):
    """A few calls (on the GPU where there is one): the JSON has a row per shape and op and the run's card and
    commit; the .md beside it holds the header and what it printed."""
    mod = load_script("benchmarks/benchmark_host_overhead.py")
    out = tmp_path / "cpu.json"
    mod.main([str(out), "--calls", "20", "--repeats", "1"])
    data = json.loads(out.read_text())
    ops = {r["op"] for r in data["rows"]}
    assert {"pack_send", "unpack_combine", "lse_reduce_n1"} <= ops
    assert all(r["host_us"] > 0 for r in data["rows"])
    run = data["run"]
    assert run["card"] == mod._run.card() and re.fullmatch(r"[0-9a-f]{40}", run["commit"])
    assert run["command"].startswith("python ") and str(out) in run["command"]
    md = out.with_suffix(".md").read_text()
    assert md.startswith(f"# host_overhead on {run['card']}") and "pack_send" in md


def test_a_benchmark_refuses_a_bad_value_in_one_usage_line(capsys):
    mod = load_script("benchmarks/benchmark_decode_latency.py")
    with pytest.raises(SystemExit) as done:
        mod.main(["out.json", "--rounds", "0"])
    assert done.value.code == 2
    assert "argument --rounds: expected a positive integer, got 0" in capsys.readouterr().err


def test_the_eval_decode_step_benchmark_refuses_an_out_it_cannot_create(tmp_path, monkeypatch,
                                                                       capsys):
    mod = load_script("benchmarks/benchmark_eval_decode_step.py")
    monkeypatch.setenv("DCP_A2A_MODEL_CACHE", str(tmp_path / "empty"))
    with pytest.raises(SystemExit) as done:
        mod.main(["--out", "/proc/nope/o"])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1
    assert "argument --out: /proc/nope/o cannot be created" in err[0]


def test_record_adds_the_run_to_a_json_another_command_wrote(tmp_path, capsys):
    mod = load_script("benchmarks/record.py")
    out = tmp_path / "grid" / "h100.json"
    out.parent.mkdir()
    writer = (f"import json; json.dump({{'grid': [1, 2]}}, open({str(out)!r}, 'w')); "
              "print('the printed table')")
    assert mod.main([str(out), "--", sys.executable, "-c", writer]) == 0
    data = json.loads(out.read_text())
    assert data["grid"] == [1, 2] and data["run"]["command"].startswith(sys.executable)
    md = out.with_suffix(".md").read_text()
    assert md.startswith("# grid on ") and "the printed table" in md
    # a command that fails, or writes nothing, records nothing
    assert mod.main([str(tmp_path / "x.json"), "--", sys.executable, "-c", "pass"]) == 1
    assert mod.main([str(tmp_path / "y.json"), "--", sys.executable, "-c",
                     "raise SystemExit(3)"]) == 3
    assert not (tmp_path / "x.md").exists() and not (tmp_path / "y.json").exists()
