"""Machine detection -> tier plan, and the summarising logic, on synthetic inputs."""

from __future__ import annotations

import math
import sys

import pytest

from dcp_a2a.testing import evaljobs, sessions, tally, tiers
from dcp_a2a.testing.sessions import run_problem

pytestmark = pytest.mark.unit


def machine(n_gpu=0, cuda=None, evals_ok=False):
    return {"cuda_device_count": n_gpu, "torch": "2.x", "torch_cuda": cuda,
            "distributed": {"available": True, "gloo": True, "nccl": n_gpu > 0},
            "eval_model": "/m.gguf" if evals_ok else None, "gsm8k_present": evals_ok,
            "gsm8k_dir": "/d", "modules": {"xdist": True}}


def runs(plans):
    return {p.name: (p.run, p.reason) for p in plans}


def test_cpu_machine_runs_cpu_tiers_and_names_the_rest():
    p = runs(tiers.plan_tiers(machine(), None, evals=False))
    assert all(p[t][0] for t in tiers.CPU_TIERS)
    assert p["gpu"] == (False, "no CUDA GPU (torch 2.x is a CPU build)")
    assert p["multigpu"] == (False, "needs >= 2 CUDA GPUs, found 0")
    assert p["e2e"] == (False, "not requested (pass --evals)")


@pytest.mark.parametrize("n_gpu,gpu,multigpu", [(1, True, False), (2, True, True),
                                                (4, True, True)])
def test_gpu_machines(n_gpu, gpu, multigpu):
    p = runs(tiers.plan_tiers(machine(n_gpu, cuda="12.8"), None, evals=True))
    assert (p["gpu"][0], p["multigpu"][0], p["e2e"][0]) == (gpu, multigpu, True)


@pytest.mark.parametrize("dist", [{"available": False, "gloo": False, "nccl": False},
                                  {"available": True, "gloo": False, "nccl": False}],
                         ids=["no_distributed", "no_backend"])
def test_multiproc_needs_a_process_group_backend(dist):
    p = runs(tiers.plan_tiers(machine() | {"distributed": dist}, None, evals=False))
    assert p["multiproc"] == (False, "torch.distributed has no gloo/nccl backend in this torch "
                                     "build")
    assert p["unit"][0] and p["conformance"][0]


def test_gpu_tiers_never_pass_on_the_interpreter():
    """TRITON_INTERPRET=1 left set on a GPU node: the tiers that judge compiled kernels do not
    run (and gpu-check refuses), rather than pass on interpreted ones."""
    m = machine(4, cuda="12.8") | {"triton_mode": "interpreter", "TRITON_INTERPRET": "1"}
    p = runs(tiers.plan_tiers(m, None, evals=False))
    for tier in ("gpu", "multigpu"):
        assert p[tier][0] is False and p[tier][1].startswith("TRITON_INTERPRET=1 runs Triton's")
    assert p["kernel"][0]


def test_gpu_check_refuses_the_interpreter(monkeypatch, capsys, tmp_path):
    from dcp_a2a.testing import devices, gpucheck

    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert gpucheck.main(["--out", str(tmp_path / "g")]) == 2
    assert not (tmp_path / "g").exists()
    assert "judges the compiled kernels" in capsys.readouterr().err


def test_multigpu_gets_its_own_serial_session():
    plans = tiers.plan_tiers(machine(4, cuda="12.8"), None, evals=False)
    rs = tiers.plan_runs(plans, "auto")
    assert [r.name for r in rs] == ["main", "multigpu"]
    assert "multigpu" in rs[0].exclude and "e2e" in rs[0].exclude
    assert rs[1].workers is None


def test_explicit_tiers_and_quick():
    p = runs(tiers.plan_tiers(machine(), ["unit", "gpu"], evals=False))
    assert p["unit"][0] and not p["kernel"][0] and not p["gpu"][0]
    assert p["kernel"][1] == "not selected (--tiers)"
    q = runs(tiers.plan_tiers(machine(), None, evals=False, quick=True))
    assert [t for t in tiers.TIERS if q[t][0]] == list(tiers.QUICK_TIERS)
    assert q["multiproc"][1] == q["numerics"][1] == "not in the quick subset"
    rs = tiers.plan_runs(tiers.plan_tiers(machine(), None, evals=False, quick=True), 0)
    assert {"multiproc", "numerics", "gpu"} <= set(rs[0].exclude)


def test_quick_with_evals_runs_the_e2e_tier():
    """``--quick --evals`` asks for the e2e tier by name: the quick subset does not leave it out
    (its plan said "not selected (--tiers)", which no --tiers had asked)."""
    q = runs(tiers.plan_tiers(machine(), None, evals=True, quick=True))
    assert q["e2e"] == (True, None)
    assert [t for t in tiers.TIERS if q[t][0]] == [*tiers.QUICK_TIERS, "e2e"]
    assert q["multiproc"][1] == "not in the quick subset"
    assert "e2e" not in tiers.plan_runs(tiers.plan_tiers(machine(), None, True, True), 0)[0].exclude


def rec(nodeid, outcome, tiers, merges=(), text="", duration=1.0):
    return {"nodeid": nodeid, "outcome": outcome, "tiers": list(tiers), "text": text,
            "duration": duration, "merge_reports": list(merges)}


def mr(dtype, ratio, kind="a2a", hist=None):
    return {"dtype": dtype, "kind": kind, "world_size": 4, "base": "e", "worst_ratio": ratio,
            "ok": ratio <= 1, "ulp_histogram": hist or [1] + [0] * 24,
            "output": {"elements": sum(hist or [1]), "max_ulp_err": 0.5 * ratio,
                       "upstream_ok": True}}


def test_statuses_and_headroom():
    plans = tiers.plan_tiers(machine(), None, evals=False)
    records = [
        rec("a", "passed", ["unit"]),
        rec("b", "error", ["kernel", "conformance"], [mr("float16", 0.5)]),
        rec("c", "passed", ["kernel"], [mr("float16", math.inf)], duration=2.5),
        rec("d", "skipped", ["numerics"], text="no scipy"),
        rec("e", "xfailed", ["numerics"], text="the carved design\nits traceback"),
        rec("f", "xpassed", ["unit"]),
    ]
    s = {t.name: t for t in tally.summarise_tiers(plans, records, [])}
    assert (s["unit"].status, s["kernel"].status, s["conformance"].status) == (
        "passed", "failed", "failed")
    assert s["kernel"].errors == 1 and s["kernel"].worst_ratio == math.inf
    assert s["kernel"].headroom == 0.0 and s["conformance"].headroom == 2.0
    assert s["numerics"].status == "skipped" and s["numerics"].reason == "no scipy"
    assert s["multiproc"].status == "no tests"
    assert s["gpu"].status == "not run" and s["gpu"].cases == 0
    assert (s["kernel"].time_s, s["unit"].time_s, s["gpu"].time_s) == (3.5, 2.0, 0.0)
    assert (s["kernel"].merge_checks, s["conformance"].merge_checks) == (2, 1)
    assert s["kernel"].worst_case["nodeid"] == "c"
    assert s["kernel"].worst_case["max_ulp_err"] == math.inf
    n, u = s["numerics"], s["unit"]
    assert (n.cases, n.skipped, n.xfailed, n.passed) == (2, 1, 1, 0)
    assert n.skip_reasons == {"no scipy": 1} and n.xfail_reasons == {"the carved design": 1}
    assert (u.cases, u.passed, u.xpassed, u.xfailed) == (2, 1, 1, 0)


def test_exact_results_have_infinite_headroom():
    assert tally.headroom(0.0) == math.inf and tally.headroom(None) is None
    assert tally.as_plain({"x": math.inf, "y": [math.nan]}) == {"x": "inf", "y": ["nan"]}


def test_dtype_summary_uses_real_merge_reports():
    torch = pytest.importorskip("torch")
    from dcp_a2a.testing.compare import check_merge
    from dcp_a2a.reference import lse_weighted_combine

    g = torch.Generator().manual_seed(0)
    outs = torch.randn(3, 2, 4, 8, generator=g).to(torch.bfloat16)
    lses = torch.randn(3, 2, 4, generator=g) * 4
    exact = lse_weighted_combine(outs, lses).to(torch.bfloat16)
    rep = check_merge(exact, None, outs, lses).as_dict()
    d = tally.summarise_dtypes([rec("t", "passed", ["kernel"], [rep, rep])])["bfloat16"]
    assert d["checks"] == 2 and sum(d["histogram"]["a2a"]) == 2 * exact.numel()
    assert d["worst_ratio"] == rep["worst_ratio"] <= 1


def test_dtype_summary_sums_ratio_histograms_and_names_what_upstream_would_fail():
    """The err/bound histogram (the criterion the ulp plot alone misstates for float32) is
    summed per dtype; checks the upstream #41160 comparison would fail are listed by test."""
    torch = pytest.importorskip("torch")
    from dcp_a2a.testing.compare import RATIO_BIN_EDGES, check_merge
    from dcp_a2a.reference import lse_weighted_combine

    g = torch.Generator().manual_seed(1)
    outs = torch.randn(2, 2, 4, 8, generator=g, dtype=torch.float64).float() * 1e6
    lses = torch.randn(2, 2, 4, generator=g) * 4
    exact = lse_weighted_combine(outs, lses).float()
    off = exact * (1 + 2 ** -22)  # two fp32 ulps off: within the bound
    reps = [check_merge(x, None, outs, lses).as_dict() for x in (exact, off)]
    big = exact.clone()
    big[0, 0, 0] += 1.0  # 1.0 absolute at |y| ~ 1e6: 2^-20 relative, far over our bound
    bad = check_merge(big, None, outs, lses).as_dict()
    bad["output"]["upstream_ok"] = False  # as the upstream check says of such an element
    d = tally.summarise_dtypes([rec("t::ok", "passed", ["kernel"], reps),
                              rec("t::bad", "failed", ["kernel"], [bad])])["float32"]
    assert len(d["ratio_histogram"]) == len(RATIO_BIN_EDGES) - 1
    assert sum(d["ratio_histogram"]) == 3 * exact.numel()
    assert d["ratio_histogram"][-1] >= 1 and d["worst_output_ratio"] > 1
    assert d["upstream_failing"] == [{"nodeid": "t::bad", "quantities": ["output"],
                                      "kind": "a2a", "world_size": 2}]
    assert d["upstream_would_pass"] == 2 and d["checks"] == 3


class _Res:
    def __init__(self, code, records, session=True):
        self.exit_status, self.records = code, records
        self.session = {"exitstatus": code} if session else {}


def test_run_problems():
    assert run_problem(_Res(0, [rec("a", "passed", [])])) is None
    assert run_problem(_Res(1, [rec("a", "failed", [])])) is None
    assert run_problem(_Res(1, [rec("a", "passed", [])])) == \
        "pytest reported a failure that no test record shows"
    assert run_problem(_Res(0, [rec("a", "error", [])])) == \
        "pytest reported success but a test record shows a failure"
    assert [run_problem(_Res(c, [])) for c in (2, 3, 4, 5)] == [
        "interrupted", "internal error", "usage error", None]
    # a session stopped after a test failed is still an interrupted one (exit 2), not success
    assert [run_problem(_Res(c, [rec("a", "failed", [])])) for c in (2, 3)] == [
        "interrupted", "internal error"]
    assert run_problem(_Res(0, [], session=False)) == "ended without a session record"
    assert run_problem(_Res(-9, [], session=False)) == \
        "the pytest process died (exit status -9) before the session ended"


def test_eval_jobs_name_everything_that_is_missing(tmp_path):
    """Each job names every thing it lacks, exactly, before anything runs: the modules not
    installed (only gguf missing names gguf alone), no prepared model, no data (logit parity
    reads GSM8K too). (The first missing thing alone left a missing GSM8K directory unsaid.)"""
    m = machine()
    present = {"dcp_a2a.evals.logit_parity": True, "dcp_a2a.evals.gsm8k": True,
               "transformers": True, "gguf": True, "accelerate": True, "lm_eval": True}
    no_model = "no eval model is prepared (python -m dcp_a2a.evals.prepare --model NAME; " \
               "docs/evals.md lists them)"
    no_data = "GSM8K data not found at /d (test.jsonl; --gsm8k-dir or $DCP_A2A_GSM8K_DIR)"
    m["modules"] = dict(present, gguf=False)
    lp, gs = evaljobs.plan_evals(m, tmp_path, 10, "reference,packed")
    assert lp.reason.split("; ", 1)[0] == "gguf is not installed (pip install -e '.[evals]')"
    assert lp.reason == gs.reason == "; ".join(
        ["gguf is not installed (pip install -e '.[evals]')", no_model, no_data])
    m["modules"] = dict(present, lm_eval=False, **{"dcp_a2a.evals.logit_parity": False})
    lp, gs = evaljobs.plan_evals(m, tmp_path, 10, "reference,packed")
    assert lp.reason == "dcp_a2a.evals.logit_parity is not in this installation" and not lp.command
    assert gs.reason == "; ".join(["lm-eval is not installed (pip install -e '.[evals]')",
                                   no_model, no_data])
    m["modules"] = present
    for job in evaljobs.plan_evals(m, tmp_path, 10, "reference,packed"):
        assert job.reason == f"{no_model}; {no_data}", job.reason
    m["eval_model_name"] = "qwen2.5-coder-0.5b"
    for job in evaljobs.plan_evals(m, tmp_path, 10, "reference,packed"):
        assert job.reason == ("eval model qwen2.5-coder-0.5b is not prepared (python -m "
                              f"dcp_a2a.evals.prepare --model qwen2.5-coder-0.5b); {no_data}")
    m["eval_model"] = "/m.gguf"
    for job in evaljobs.plan_evals(m, tmp_path, 10, "reference,packed"):
        assert job.reason == no_data, job.reason


def test_evals_cannot_measure_another_implementation(tmp_path):
    m = machine(evals_ok=True)
    m["modules"] = {k: True for k in ("dcp_a2a.evals.logit_parity", "dcp_a2a.evals.gsm8k",
                                      "transformers", "gguf", "accelerate", "lm_eval")}
    for job in evaljobs.plan_evals(m, tmp_path, 10, "reference,packed", impl="my_engine.adapter"):
        assert "cannot measure --impl my_engine.adapter" in job.reason and not job.command


def test_a_failed_eval_job_says_why_and_links_its_log_not_a_missing_result(tmp_path):
    from dcp_a2a.testing import report as rep

    job = evaljobs.EvalJob("logit_parity", "x", command=[
        sys.executable, "-c", "import sys; print('loading'); "
        "print('logit_parity: error: GSM8K data not found', file=sys.stderr); sys.exit(2)"],
        result_file=str(tmp_path / "evals" / "logit_parity"))
    job = evaljobs.run_eval(job, tmp_path)
    assert (job.status, job.exit_status) == ("failed", 2)
    assert job.reason == "logit_parity: error: GSM8K data not found"
    assert job.result_file is None and job.log == str(tmp_path / "evals" / "logit_parity.log")
    report = {"evals": [tally.as_plain(job)]}
    lines = [ln for ln in _eval_section(rep, report) if ln.startswith("| logit_parity")]
    assert lines == [f"| logit_parity | failed: {job.reason} | {rep.fmt_time(job.wall_s)} | - | "
                     f"`{job.log}` |"]


def _eval_section(rep, report):
    """The end-to-end rows of validation.md for ``report``'s evals (the rest filled in)."""
    import tempfile
    from pathlib import Path

    full = {"ok": False, "started_at": "t", "wall_s": 1.0, "exit_status": 1,
            "command": ["dcp-a2a"], "machine": {**machine(), "hostname": "h", "platform": "p",
                                               "cpu_count": 2, "python": "3", "triton": "3",
                                               "triton_mode": "interpreter",
                                               "TRITON_INTERPRET": "1", "gpus": [],
                                               "git_commit": None},
            "options": {"impl": "dcp_a2a", "quick": False},
            "implementation": {"spec": "dcp_a2a", "module": "dcp_a2a", "file": "/x.py",
                               "missing": []},
            "tiers": [], "totals": {k: 0 for k in ("cases", "passed", "xpassed", "failed",
                                                   "error", "skipped", "xfailed")},
            "dtypes": {}, "failures": [], "runs": [], "paths": {"png": {}}} | report
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "v.md"
        rep.write_markdown(full, path)
        return path.read_text().splitlines()


@pytest.mark.parametrize("present", [set(), {"xdist"}, {"xdist", "pytest_benchmark"}])
def test_pytest_command_workers_and_foreign_plugins(monkeypatch, tmp_path, present):
    """xdist only where it is installed; pytest-benchmark (GPU images carry it) switched off
    under xdist, where it would only warn once per worker; serial sessions block xdist."""
    monkeypatch.setattr(sessions, "module_present", lambda name: name in present)
    parallel = sessions.pytest_command(tiers.RunSpec("main", ["unit"], [], 2), tmp_path / "p",
                                       impl=None, quick=False)
    serial = sessions.pytest_command(tiers.RunSpec("multigpu", ["multigpu"], [], None),
                                     tmp_path / "p", impl=None, quick=False)
    joined = " ".join(parallel)
    assert ("-n 2 --dist loadgroup" in joined) == ("xdist" in present)
    assert ("-p no:benchmark" in joined) == ({"xdist", "pytest_benchmark"} <= present)
    assert ("-p no:xdist" in " ".join(serial)) == ("xdist" in present)
    assert "no:benchmark" not in " ".join(serial)


@pytest.mark.parametrize("jobs", [1, 3])
def test_selfcheck_sessions_take_the_same_worker_options(monkeypatch, tmp_path, jobs):
    """The self-check's pytest sessions are spread over workers as validate's are (loadgroup,
    so that one pool of ranks serves its tests; -p no:xdist for one process)."""
    from dcp_a2a.testing import conformance_run

    monkeypatch.setattr(sessions, "module_present",
                        lambda name: name in {"xdist", "pytest_benchmark"})
    monkeypatch.setattr(conformance_run, "_forkable", lambda: False)
    seen = []

    def started(cmd, *args):  # what the self-check would run, instead of running it
        seen.append(cmd)
        return 0, False

    monkeypatch.setattr(conformance_run, "_pytest_subprocess", started)
    conformance_run.run_one("dcp_a2a", "correct", root=tmp_path, jobs=jobs, timeout=1,
                      workdir=tmp_path, paths=[], marker="conformance")
    (cmd,) = seen
    expected = sessions.xdist_args(jobs if jobs > 1 else None)
    assert " ".join(expected) in " ".join(cmd)
    assert ("--dist loadgroup" in " ".join(cmd)) == (jobs > 1)


@pytest.mark.parametrize("seconds,shown", [(0.04, "0.0s"), (59.96, "1m00.0s"), (61.25, "1m01.2s"),
                                           (119.97, "2m00.0s"), (3600.0, "60m00.0s")])
def test_times_never_show_60_seconds(seconds, shown):
    from dcp_a2a.testing import report as rep

    assert rep.fmt_time(seconds) == shown


def test_totals_count_every_outcome_and_sum_the_time():
    records = [rec("a", "passed", ["unit"], duration=1.5), rec("b", "failed", ["unit"]),
               rec("c", "passed", ["kernel"], duration=None), rec("d", "xfailed", ["unit"])]
    t = tally.totals(records)
    assert (t["cases"], t["passed"], t["failed"], t["xfailed"], t["skipped"]) == (4, 2, 1, 1, 0)
    assert t["test_time_s"] == 3.5
