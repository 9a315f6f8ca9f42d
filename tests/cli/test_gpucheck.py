"""CLI tier: gpu-check's summary and its self-check step, without a GPU (the step's command
is faked; on a GPU machine the real one runs in `dcp-a2a gpu-check`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dcp_a2a.testing import gpucheck

pytestmark = pytest.mark.unit


def _mutant(name, verdict):
    return {"spec": f"dcp_a2a.testing.mutants.{name}", "kind": "mutant", "verdict": verdict,
            "passed": 0, "failed": int(verdict == "killed")}


def test_selfcheck_step_names_survivors_and_the_contract(monkeypatch, tmp_path):
    runs = [{"spec": "dcp_a2a.reference.contract", "kind": "correct", "verdict": "pass",
             "passed": 387, "failed": 0},
            _mutant("a", "killed"), _mutant("b", "SURVIVED"), _mutant("c", "not run")]
    seen = []

    def fake_run(cmd, log, env, timeout_s=None):  # the self-check's report: b survived
        seen.append(cmd)
        with open(cmd[cmd.index("--json") + 1], "w") as fh:
            json.dump({"runs": runs, "ok": False, "seconds": 1.0}, fh)
        return 1, 1.0

    monkeypatch.setattr(gpucheck, "_run", fake_run)
    step = gpucheck.selfcheck_step(tmp_path, 4, {})
    assert step.status == "failed"
    assert step.detail == ("1/3 mutants killed (1 need more GPUs: not run); "
                           "dcp_a2a.reference.contract pass (387 passed, 0 failed); b SURVIVED")
    (cmd,) = seen
    # the project's own implementation is judged by the validate step; the contract here
    i = cmd.index("--correct")
    assert cmd[i + 1:i + 3] == ["dcp_a2a.reference.contract", "dcp_a2a.testing.freedoms"]
    # the two correct runs at once, sharing -j 4; -j 1 leaves them one after the other
    assert (cmd[cmd.index("--jobs") + 1], cmd[cmd.index("--correct-parallel") + 1]) == ("2", "2")
    seen.clear()
    gpucheck.selfcheck_step(tmp_path, 1, {})
    assert (seen[0][seen[0].index("--jobs") + 1],
            seen[0][seen[0].index("--correct-parallel") + 1]) == ("1", "1")


def test_a_skipped_step_never_reads_as_a_full_pass():
    steps = [gpucheck.Step("validate", "passed", 1.0, "unit 1/1"),
             gpucheck.Step("selfcheck", "skipped", 0.0, "--skip")]
    text = gpucheck.summary(steps, "a machine")
    assert text.endswith("gpu-check: PASS (of the steps run; skipped: selfcheck)")
    steps.append(gpucheck.Step("bench", "failed", 1.0, ""))
    assert gpucheck.summary(steps, "a machine").endswith(
        "gpu-check: FAIL (of the steps run; skipped: selfcheck)")
    assert gpucheck.summary(steps[:1], "m").endswith("gpu-check: PASS")
    # the check's wall time, naming the steps that overlapped only when both ran
    four = [gpucheck.Step(n, "passed", 1.0) for n in gpucheck.STEPS]
    assert "in all" in gpucheck.summary(four, "m", 3.0) and \
        "(selfcheck and accuracy at the same time)" in gpucheck.summary(four, "m", 3.0)
    four[2].status = "skipped"
    assert "at the same time" not in gpucheck.summary(four, "m", 3.0)
    assert [gpucheck.exit_status(x) for x in (steps[:1], steps[:2], steps)] == [0, 0, 1]


def test_every_step_skipped_is_nothing_checked_not_a_pass():
    """``gpu-check --skip validate selfcheck accuracy bench`` said PASS and exited 0 having run
    nothing; now it says so and exits 5, as validate does when nothing was validated."""
    steps = [gpucheck.Step(name, "skipped", 0.0, "--skip") for name in gpucheck.STEPS]
    assert gpucheck.summary(steps, "m").endswith("gpu-check: NOTHING CHECKED")
    assert gpucheck.exit_status(steps) == 5


def test_validate_step_runs_the_command_line_and_the_dependency_runs_one_way(monkeypatch,
                                                                             tmp_path):
    """gpu-check runs `python -m dcp_a2a validate` as a command. At import the dependency runs
    one way, cli -> gpucheck (cli builds its parser from the programs): gpucheck reaches cli only
    when it is called, to parse an argument list, so neither module needs the other
    half-built."""
    import ast
    import sys
    from pathlib import Path

    seen = []
    monkeypatch.setattr(gpucheck, "_run",
                        lambda cmd, log, env, timeout_s=None: (seen.append(cmd), (3, 0.5))[1])
    step = gpucheck.validate_step(tmp_path, 4, {})
    assert seen == [[sys.executable, "-m", "dcp_a2a", "validate", "--out", str(tmp_path),
                     "--no-progress", "-j", "4"]]
    assert step.status == "failed" and step.detail.startswith("exit status 3")
    tree = ast.parse(Path(gpucheck.__file__).read_text())
    at_import = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in at_import for a in n.names} | {
        n.module for n in at_import if isinstance(n, ast.ImportFrom)}
    assert not names & {"cli", "dcp_a2a.testing.cli", "validate"}, names


def test_version_names_the_installation(capsys):
    import dcp_a2a
    from dcp_a2a.testing import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == (
        f"dcp-a2a {dcp_a2a.__version__} ({Path(dcp_a2a.__file__).parent})")


def test_a_hung_step_is_killed_and_fails_naming_the_hang(monkeypatch, tmp_path):
    """A step that outlives its limit (an NCCL rank that never returns) is killed with what it
    started; the step fails saying so, and no report of an earlier run is read instead."""
    import sys

    log = tmp_path / "hang.log"
    code, wall = gpucheck._run([sys.executable, "-c", "import time; time.sleep(60)"], log,
                               {}, timeout_s=1)
    assert code == gpucheck.TIMED_OUT and wall < 30
    assert "killed after 1 s (a hang)" in log.read_text()
    (tmp_path / "accuracy.json").write_text('{"cases": []}')  # a previous run's report
    monkeypatch.setattr(gpucheck, "_run", lambda cmd, log, env, timeout_s=None:
                        (gpucheck.TIMED_OUT, 900.0))
    step = gpucheck.accuracy_step(tmp_path, 1, {})
    assert step.status == "failed" and step.detail.startswith("killed after 900 s (a hang)")
    assert not (tmp_path / "accuracy.json").exists()


def test_accuracy_step_runs_every_case_of_the_job(monkeypatch, tmp_path):
    """gpu-check shortens the accuracy job's timing loop (1 warm-up, 2 timed calls), never its
    cases: the command parses to the job's default shapes, dtypes, backends and bases."""
    from dcp_a2a.testing import accuracy

    seen = []
    monkeypatch.setattr(gpucheck, "_run", lambda cmd, log, env, timeout_s=None:
                        (seen.append(cmd), (1, 0.0))[1])
    gpucheck.accuracy_step(tmp_path, 1, {})
    (cmd,) = seen
    assert cmd[cmd.index("-m", 3):cmd.index("accuracy") + 1] == ["-m", "dcp_a2a", "accuracy"]
    args = accuracy.parse_args(cmd[cmd.index("accuracy") + 1:])
    defaults = accuracy.parse_args([])
    assert (args.warmup, args.iters) == (1, 2)
    for name in ("shapes", "dtype", "backend", "base", "impl", "seed", "spread"):
        assert getattr(args, name) == getattr(defaults, name), name


def test_selfcheck_and_accuracy_overlap_the_bench_runs_alone():
    """The schedule: validate, then the self-check and the accuracy job at the same time, then
    the bench alone (it times kernels); a skipped step is not run and reads as skipped."""
    import threading
    import time

    spans, started = {}, threading.Barrier(2, timeout=10)

    def step(name, meet=False):
        def run():
            t0 = time.monotonic()
            if meet:
                started.wait()  # both running at once, or this times out
            time.sleep(0.05)
            spans[name] = (t0, time.monotonic())
            return gpucheck.Step(name, "passed")
        return run
    run = {"validate": step("validate"), "selfcheck": step("selfcheck", True),
           "accuracy": step("accuracy", True), "bench": step("bench")}
    done = gpucheck.run_schedule(run, set())
    assert [done[n].status for n in gpucheck.STEPS] == ["passed"] * 4
    assert spans["validate"][1] <= min(spans["selfcheck"][0], spans["accuracy"][0])
    assert spans["bench"][0] >= max(spans["selfcheck"][1], spans["accuracy"][1])
    spans.clear()
    run["selfcheck"] = step("selfcheck")
    done = gpucheck.run_schedule(run, {"accuracy"})  # the self-check then runs alone
    assert done["accuracy"].status == "skipped" and "accuracy" not in spans


def test_a_shared_card_is_named_above_the_verdict(monkeypatch):
    """Another process holding GPU memory (a GSM8K job beside gpu-check ran its large-batch
    tests out of memory, 2026-12-06) is said above the verdict, which it never changes."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    smi = "0, 46995, 81559\n1, 310, 81559\n"
    sample = gpucheck.gpu_memory_in_use(lambda: smi)
    assert [(i, round(u, 1), round(t, 1)) for i, u, t in sample] == [(0, 45.9, 79.6),
                                                                      (1, 0.3, 79.6)]
    note = gpucheck.shared_note(sample, [(0, 1.0, 79.6)])
    assert note.startswith("note: the card was shared (GPU 0: 45.9 of 79.6 GiB held")
    assert "GPU 1" not in note and gpucheck.shared_note([(0, 0.5, 79.6)], []) == ""
    failed = [gpucheck.Step("validate", status="failed")]
    text = gpucheck.summary(failed, "m", note=note)
    assert note in text and text.endswith("gpu-check: FAIL")
    assert gpucheck.summary([gpucheck.Step("bench", status="passed")], "m",
                            note=note).endswith("gpu-check: PASS")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [i for i, _, _ in gpucheck.gpu_memory_in_use(lambda: smi)] == [1]
    assert gpucheck.gpu_memory_in_use(lambda: "no GPU here") == []


def test_code_changed_during_the_run_is_said_above_the_verdict(tmp_path):
    """Files of the code under test rewritten while the steps ran (2026-12-06: the device tool
    copied the caller's tree over the checkout under gpu-check, and 7 unit tests failed to
    import a file it was rewriting) are named above the verdict; caches and other files are
    not code."""
    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "t.yaml").write_text("k: 1\n")
    (pkg / "notes.md").write_text("text\n")
    before = gpucheck.code_fingerprint([pkg, tmp_path / "gone.yaml"])
    assert sorted(Path(p).name for p in before) == ["a.py", "t.yaml"]
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (pkg / "notes.md").write_text("more text\n")
    assert gpucheck.changed_note(before, gpucheck.code_fingerprint([pkg])) == ""
    (pkg / "a.py").write_text("x = 22\n")
    (pkg / "b.py").write_text("y = 1\n")
    note = gpucheck.changed_note(before, gpucheck.code_fingerprint([pkg]))
    assert note.startswith("note: 2 file(s) of the code under test changed during the run "
                           f"(first: {pkg / 'a.py'})")
    text = gpucheck.summary([gpucheck.Step("bench", status="passed")], "m", note=note)
    assert note in text and text.endswith("gpu-check: PASS")


def test_the_code_roots_are_what_the_steps_import():
    import dcp_a2a
    import dcp_a2a.reference

    roots = gpucheck.code_roots()
    assert Path(dcp_a2a.__file__).parent in roots
    assert Path(dcp_a2a.reference.__file__).parent in roots
    fp = gpucheck.code_fingerprint(roots)
    assert str(Path(gpucheck.__file__)) in fp
