"""``dcp-a2a validate`` end to end on a synthetic suite whose outcomes are known in advance:
tier attribution, statuses, headroom, exit status and the files written."""

from __future__ import annotations

import json
import math

import pytest

from dcp_a2a.testing import cli, validate

from ._fake_suite import write_suite

pytestmark = pytest.mark.unit

CPU_TIERS = "unit,kernel,multiproc,conformance,numerics"


def _validate(tmp_path, *args, failing, **suite):
    suite = write_suite(tmp_path / "suite", failing=failing, **suite)
    out = tmp_path / "report"
    code = cli.main(["validate", "--suite", str(suite), "--out", str(out), "-j", "0",
                     "--no-progress", *args])
    return code, json.loads((out / "validation.json").read_text()), out


@pytest.mark.slow  # a pytest session (torch import): seconds, not for --quick
def test_report_of_a_failing_suite(tmp_path):
    """One validate run (a pytest session costs seconds), every property of its report."""
    run = _validate(tmp_path, "--tiers", CPU_TIERS, failing=True)
    for check in (_failure_gives_nonzero_exit_and_is_listed,
                  _tiers_counted_from_markers_and_directories,
                  _headroom_is_worst_ratio_inverted,
                  _all_skipped_tier_is_skipped_not_passed,
                  _tiers_that_cannot_run_are_listed_with_reason,
                  _ulp_histograms_summed_per_dtype_and_kind,
                  _markdown_and_machine_info):
        check(run)


def _tier(report, name):
    return next(t for t in report["tiers"] if t["name"] == name)


def _failure_gives_nonzero_exit_and_is_listed(failing_run):
    code, rep, _ = failing_run
    assert rep["command"][:3] == ["dcp-a2a", "validate", "--suite"]  # this call's arguments
    assert code == validate.EXIT_FAILED and rep["ok"] is False
    assert [f["nodeid"] for f in rep["failures"]] == ["tests/kernel/test_kfail.py::test_too_far"]
    assert "over the bound" in rep["failures"][0]["text"]
    assert rep["failures"][0]["message"].startswith("AssertionError: merge check")


def _tiers_counted_from_markers_and_directories(failing_run):
    _, rep, _ = failing_run
    unit, kernel, conf = (_tier(rep, n) for n in ("unit", "kernel", "conformance"))
    # unit: test_pass, 3 params, slow, and the kernel+conformance test also marked unit
    assert (unit["status"], unit["cases"], unit["passed"], unit["failed"]) == ("passed", 6, 6, 0)
    # kernel: the marked test, the unmarked test in tests/kernel/, the failing one; the
    # gpu-marked kernel test cannot run here and is counted as not run, never as passed
    assert (kernel["status"], kernel["cases"], kernel["passed"], kernel["failed"],
            kernel["not_run"]) == ("failed", 3, 2, 1, 1)
    assert (conf["status"], conf["cases"], conf["passed"]) == ("passed", 1, 1)
    # each test ran once: the total counts tests, not tier memberships
    assert rep["totals"]["cases"] == 6 + 2 + 1


def _headroom_is_worst_ratio_inverted(failing_run):
    _, rep, _ = failing_run
    kernel, conf = _tier(rep, "kernel"), _tier(rep, "conformance")
    assert kernel["worst_ratio"] == 2.0 and kernel["headroom"] == 0.5
    assert kernel["worst_case"]["nodeid"].endswith("test_too_far")
    assert conf["worst_ratio"] == 0.25 and conf["headroom"] == 4.0
    assert rep["worst_ratio"] == 2.0 and rep["headroom"] == 0.5  # over the tiers that ran
    assert _tier(rep, "unit")["headroom"] == 4.0  # its one merge check is the shared test's


def _all_skipped_tier_is_skipped_not_passed(failing_run):
    _, rep, _ = failing_run
    num = _tier(rep, "numerics")
    assert (num["status"], num["skipped"], num["passed"]) == ("skipped", 1, 0)
    assert num["reason"] == "needs something absent"
    assert _tier(rep, "multiproc")["status"] == "no tests"


def _tiers_that_cannot_run_are_listed_with_reason(failing_run):
    _, rep, _ = failing_run
    for name in ("gpu", "multigpu", "e2e"):
        t = _tier(rep, name)
        assert t["status"] == "not run" and t["reason"] and t["passed"] == 0
    assert _tier(rep, "gpu")["not_run"] == 1 and _tier(rep, "multigpu")["not_run"] == 1
    assert rep["untiered_tests"] == ["tests/misc/test_stray.py::test_in_no_tier"]
    assert rep["selfcheck_tests"] == ["tests/misc/test_stray.py::test_of_the_selfcheck"]


def _ulp_histograms_summed_per_dtype_and_kind(failing_run):
    _, rep, out = failing_run
    f16 = rep["dtypes"]["float16"]
    assert f16["checks"] == 3
    a2a = f16["histogram"]["a2a"]
    assert (a2a[0], a2a[5], a2a[10], sum(a2a)) == (40, 2, 1, 43)
    assert f16["histogram"]["ag_rs"][12] == 7
    assert f16["worst_ratio"] == 2.0 and f16["failing_checks"] == 1
    assert math.isclose(f16["max_ulp_err_by_kind"]["ag_rs"], 0.6)
    assert rep["dtypes"]["bfloat16"]["checks"] == 1
    for dt in ("float16", "bfloat16"):
        png = out / f"ulp_{dt}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _markdown_and_machine_info(failing_run):
    _, rep, out = failing_run
    md = (out / "validation.md").read_text()
    assert "FAILED" in md and "test_too_far" in md and "| numerics | skipped" in md
    # what a reader needs: xfails apart from skips, what --quick left out, GPUs in words,
    # the A2A and ag_rs ulp errors in separate columns, why 1.00x headroom is not a near miss
    assert "| xfailed |" in md and "left out (--quick)" in md
    assert ("| GPUs | none (CPU only) |" in md) == (rep["machine"]["cuda_device_count"] == 0)
    assert "max ulp (A2A) | max ulp (ag_rs)" in md
    assert "the best possible" in md
    m = rep["machine"]
    for key in ("torch", "triton", "TRITON_INTERPRET", "device", "cuda_device_count"):
        assert key in m
    assert rep["options"]["impl"] == "dcp_a2a"
    top = rep["slowest_tests"]  # where the time goes, for the GPU step table
    assert len(top) == min(30, rep["totals"]["cases"]) and top[0]["nodeid"].endswith(
        "test_both_tiers") and top[0]["duration_s"] >= 0.3
    assert [t["duration_s"] for t in top] == sorted((t["duration_s"] for t in top), reverse=True)
    assert "## Slowest" in md and "`" + top[0]["nodeid"] + "`" in md
    # the session's timeline: when each test started and when its record was written
    started = {}
    for line in (out / "raw" / "main.results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["event"] == "start":
            started[r["nodeid"]] = r["t"]
        elif r["event"] == "test" and r["phase"] != "collect":
            assert 0 <= started[r["nodeid"]] <= r["t"], r
            assert r["t"] - started[r["nodeid"]] >= r["duration"] - 0.05, r


@pytest.mark.slow
def test_quick_subset_and_passing_exit(tmp_path, capsys):
    code, rep, out = _validate(tmp_path, "--quick", "--tiers", "unit,kernel", "--no-plots",
                               failing=False)
    summary = capsys.readouterr().out
    assert rep["dtypes"] and rep["paths"]["png"] == {} and not list(out.glob("*.png"))
    from dcp_a2a.testing.report import describe_devices

    devices = describe_devices(rep["machine"])  # "CPU (no CUDA GPU)" or "2 x NVIDIA H200"
    lines = summary.splitlines()
    import dcp_a2a

    # the first line says whose code every number below measured: module and file
    assert lines[0] == f"implementation under test: dcp_a2a ({dcp_a2a.__file__})"
    assert f"on {devices}" in lines[1] and "xfail" in lines[3]
    assert "| unit | passed | 3 | 3 | 0 | 0 | 0 | 0 | 3 |" in (out / "validation.md").read_text()
    assert code == validate.EXIT_OK and rep["ok"]
    unit = _tier(rep, "unit")
    # first parametrisation only, slow dropped: test_pass, test_param[1], test_both_tiers
    assert (unit["cases"], unit["left_out"]) == (3, 3)
    ids = {t["nodeid"] for t in rep["tests"]}
    assert "tests/unit/test_u.py::test_param[1]" in ids
    assert "tests/unit/test_u.py::test_param[2]" not in ids
    assert _tier(rep, "numerics")["status"] == "not run"


def test_quick_keeps_every_contract_case(tmp_path):
    """--quick keeps one case of each of the project's test functions but every case of a
    conformance test: with the first alone it passed implementations that ignore the LSE
    base, skip the exchange, or pack over their own input (their cases come later)."""
    code, rep, _ = _validate(tmp_path, "--quick", "--tiers", "unit,kernel", "--no-plots",
                             failing=False, contract_cases=True)
    ids = {t["nodeid"] for t in rep["tests"]}
    assert {f"tests/unit/test_contract.py::test_contract_case[{c}]" for c in (1, 2, 3)} <= ids
    assert "tests/unit/test_u.py::test_param[2]" not in ids
    assert (_tier(rep, "unit")["cases"], _tier(rep, "unit")["left_out"]) == (6, 3)
    assert code == validate.EXIT_OK


@pytest.mark.parametrize("args, nothing", [
    (["--tiers", "unit,kernel", "--", "-k", "no_test_is_called_this"],
     ["no test passed", "unit (no tests)", "kernel (no tests)"]),
    (["--tiers", "unit,numerics"], ["numerics (skipped)"])], ids=["deselected", "all_skipped"])
def test_nothing_validated_is_not_a_pass(tmp_path, capsys, args, nothing):
    """A run in which no test passed (a -k that selects nothing) said PASS with 0 cases and exit
    status 0; so did a tier asked for by name whose every test skipped. Exit status 5
    (pytest's "no tests ran"), the total EMPTY, and the report says what was not validated."""
    code, rep, out = _validate(tmp_path, "--quick", "--no-plots", *args, failing=False)
    summary = capsys.readouterr().out
    assert code == validate.EXIT_NOTHING_VALIDATED and not rep["ok"], summary
    assert rep["nothing_validated"] == nothing and rep["exit_status"] == 5
    total = next(ln for ln in summary.splitlines() if ln.startswith("total"))
    assert total.split()[1] == "EMPTY", total
    assert f"nothing validated: {', '.join(nothing)} (exit status 5: not a pass)" in summary
    assert (out / "validation.md").read_text().startswith("# dcp_a2a validation — NOTHING")


def test_unknown_tier_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["validate", "--tiers", "unit,nope"])
    assert e.value.code == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.slow
def test_validate_runs_this_repository_suite(tmp_path):
    """validate's own pytest command on the real suite (a handful of unit tests): its plugins
    load and --impl is understood (a command that only worked on the synthetic suite once
    reported 0 tests in every tier on a GPU machine)."""
    out = tmp_path / "report"
    code = cli.main(["validate", "--tiers", "unit", "--out", str(out), "-j", "0",
                     "--no-progress", "--no-plots", "--",
                     "dcp_a2a/testing/conformance/test_args.py", "-k", "test_lse_pack_dim"])
    rep = json.loads((out / "validation.json").read_text())
    unit = _tier(rep, "unit")
    assert code == validate.EXIT_OK, rep["runs"]
    assert unit["status"] == "passed" and unit["passed"] >= 3
    assert all(r["problem"] is None for r in rep["runs"])


def test_a_session_that_dies_names_the_test_and_never_reads_as_a_pass(tmp_path):
    """The code under test kills the pytest process (os._exit here; a segfault or an illegal
    CUDA access in practice): no report, no session record. The test that was running is a
    failure named by id, the tests after it are counted as never run, the tier fails."""
    suite = write_suite(tmp_path / "suite", failing=False, dying=True)
    out = tmp_path / "report"
    code = cli.main(["validate", "--suite", str(suite), "--out", str(out), "-j", "0",
                     "--no-progress", "--tiers", "kernel"])
    rep = json.loads((out / "validation.json").read_text())
    assert code == 1 and not rep["ok"]
    (died,) = [f for f in rep["failures"]]
    assert died["nodeid"].endswith("test_kdies.py::test_that_kills_the_process")
    assert died["phase"] == "crash"
    assert died["clause"] == "masking"  # from the collection: the dead process recorded nothing
    assert "died while this test ran (exit status 7)" in died["message"]
    kernel = next(t for t in rep["tiers"] if t["name"] == "kernel")
    assert kernel["status"] == "failed" and kernel["unfinished"] >= 1
    assert "ended before" in kernel["reason"]
    (run,) = rep["runs"]
    assert run["problem"] == "the pytest process died (exit status 7) before the session ended"
    assert run["collect_errors"] == 0  # none reported (no session record to say otherwise)
    md = (out / "validation.md").read_text()
    assert "test_that_kills_the_process" in md and "ended before" in md


def test_a_session_pytest_ends_early_counts_what_it_never_started(tmp_path):
    """pytest fails inside itself mid-session (INTERNALERROR, exit status 3) yet prints its
    summary and the session record: the tests it never started are counted as not run and the
    tier fails (an engine run goes on with them in a further session)."""
    suite = write_suite(tmp_path / "suite", failing=False, breaking=True)
    out = tmp_path / "report"
    code = cli.main(["validate", "--suite", str(suite), "--out", str(out), "-j", "0",
                     "--no-progress", "--tiers", "kernel"])
    rep = json.loads((out / "validation.json").read_text())
    assert code == 1 and not rep["ok"]
    kernel = next(t for t in rep["tiers"] if t["name"] == "kernel")
    assert kernel["status"] == "failed" and kernel["unfinished"] >= 1, kernel


def test_a_session_that_hangs_is_stopped_and_names_the_test(tmp_path):
    """No test starts or ends for --stall-timeout seconds: validate stops the session; the test
    that was running fails as a hang, the rest count as never run, the exit status is 1
    (instead of a CI job that waits for its cap). The suite takes longer than the timeout to
    start (on a GPU machine torch and CUDA do): the clock counts from collection, so the hang
    is still the test's (on an H200 a 2 s clock from start-up stopped the session before it
    had collected anything)."""
    import time

    suite = write_suite(tmp_path / "suite", failing=False, hanging=True, start_s=3)
    out = tmp_path / "report"
    t0 = time.monotonic()
    code = cli.main(["validate", "--suite", str(suite), "--out", str(out), "-j", "0",
                     "--no-progress", "--tiers", "kernel", "--stall-timeout", "2"])
    assert time.monotonic() - t0 < 60
    rep = json.loads((out / "validation.json").read_text())
    assert code == 1 and not rep["ok"]
    (hung,) = rep["failures"]
    assert hung["nodeid"].endswith("test_khangs.py::test_that_hangs") and hung["phase"] == "hang"
    assert "no test reported for 2 s" in hung["message"]
    kernel = next(t for t in rep["tiers"] if t["name"] == "kernel")
    assert kernel["status"] == "failed" and kernel["unfinished"] >= 1
    assert rep["runs"][0]["problem"].startswith("stopped: no test reported for 2 s")


@pytest.mark.parametrize("bad", ["-1", "soon", "nan"])
def test_stall_timeout_must_be_seconds(bad, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["validate", "--stall-timeout", bad])
    assert e.value.code == 2 and "--stall-timeout" in capsys.readouterr().err


def test_ctrl_c_writes_a_partial_report_that_is_not_a_pass(tmp_path):
    """SIGINT while a test runs (a user's Ctrl-C, a CI job cancelled): validate stops its pytest
    session, writes the report of what finished marked interrupted, and exits 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    suite = write_suite(tmp_path / "suite", failing=False, hanging=True)
    out = tmp_path / "report"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcp_a2a", "validate", "--suite", str(suite), "--out", str(out),
         "-j", "0", "--no-progress", "--no-plots", "--tiers", "kernel"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "DCP_A2A_IMPL"},
        # a shell's background job (`.ci/run &`) ignores SIGINT, and children inherit that:
        # give validate the default a user's terminal gives it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
            "test_that_hangs" in p.read_text() for p in out.rglob("*.results.jsonl")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == validate.EXIT_INTERRUPTED == 130, stdout[-2000:] + stderr[-2000:]
    rep = json.loads((out / "validation.json").read_text())
    assert rep["interrupted"] and not rep["ok"] and rep["exit_status"] == 130
    assert "interrupted: writing a partial report" in stderr
