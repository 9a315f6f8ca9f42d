"""A verdict you can trust: every path of ``dcp-a2a validate`` (and of the commands engines run
beside it) either tests what was asked or refuses with a non-zero exit. Each test runs the real
command in a subprocess, as a CI job would (no mock of argparse)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dcp_a2a.testing import validate

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _run(args, *, env=None, cwd=None, timeout=600, module="dcp_a2a"):
    env = env or {}
    # the caller's implementation variable never leaks in: only what the test sets
    full = {k: v for k, v in os.environ.items() if k != "DCP_A2A_IMPL"} | env
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=timeout, env=full, cwd=cwd or ROOT)


def test_an_empty_implementation_is_refused_not_read_as_the_default(tmp_path):
    """An unset CI variable (``--impl "$IMPL"``) must not test dcp_a2a and go green: the
    command line as a CI job runs it, and the suite's own pytest entry point."""
    proc = _run(["validate", "--impl", "", "--quick", "--out", str(tmp_path)])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "empty" in proc.stderr and "unset variable" in proc.stderr
    # nothing ran (no pytest session, whose records and log land in DIR): no report to misread
    assert not list(tmp_path.iterdir())
    proc = _run(["-m", "conformance", "--co", "-q", "-p", "no:cacheprovider"],
                env={"DCP_A2A_IMPL": ""}, module="pytest")
    assert proc.returncode == 4 and "DCP_A2A_IMPL is set but empty" in proc.stderr, \
        proc.stdout[-1000:] + proc.stderr


@pytest.mark.parametrize("args, env, says", [
    (["--impl", ""], {}, "--impl is empty (an unset variable?)"),
    ([], {"DCP_A2A_IMPL": " "}, "$DCP_A2A_IMPL is set but empty (an unset variable?)"),
    (["--impl", "os"], {}, "none of the contract's functions"),
    # a class, not an instance: every call would fail for want of self (282 failures before;
    # a class of staticmethods is a namespace like a module, and loads: test below)
    (["--impl", "dcp_a2a.reference.contract:ReferenceContract"], {},
     "names a class whose contract functions are methods: name an instance of it"),
    (["--impl", "no_such_module_xyz"], {}, "cannot import implementation module "
                                            "'no_such_module_xyz'")])
def test_an_unusable_implementation_is_one_usage_error(tmp_path, monkeypatch, capsys, args, env,
                                                       says):
    """Refused before anything runs (validate's own code, in this process: no pytest session
    starts, no report is written)."""
    from dcp_a2a.testing import cli

    monkeypatch.delenv("DCP_A2A_IMPL", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = cli.main(["validate", *args, "--quick", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == validate.EXIT_USAGE and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "validation.json").exists()


@pytest.mark.parametrize("where", ["missing_parent", "a_file", "empty"])
def test_an_unusable_out_directory_is_one_usage_error(tmp_path, monkeypatch, capsys, where):
    """``--out`` under a directory that cannot be created (or written) ended validate in a
    FileNotFoundError traceback, exit 1; a file as --out likewise; an empty --out wrote the
    report files into the working directory. Now one usage line, exit 2, before any pytest
    session (the rule of every program's output directory: :mod:`dcp_a2a.testing.args`)."""
    from dcp_a2a.testing import cli

    (tmp_path / "f").write_text("")
    monkeypatch.chdir(tmp_path)
    out = {"missing_parent": "/proc/nope/report", "a_file": str(tmp_path / "f"),
           "empty": ""}[where]
    monkeypatch.delenv("DCP_A2A_IMPL", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.main(["validate", "--quick", "--out", out])
    err = capsys.readouterr().err
    assert e.value.code == validate.EXIT_USAGE and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"dcp-a2a validate: error: argument --out: {out or repr(out)}: "), err
    assert {"missing_parent": "cannot be created", "a_file": "is not a directory",
            "empty": "is empty"}[where] in err
    assert not (tmp_path / "validation.json").exists() and not (tmp_path / "raw").exists()


def test_the_numerics_report_refuses_a_partial_implementation(tmp_path, capsys):
    """It merges through pack_send and unpack_combine: an implementation without them ended
    in a MissingFunction traceback; now one usage line naming what it lacks."""
    from dcp_a2a.testing import numerics_report

    (tmp_path / "only_dim.py").write_text(  # an exchange only: no pack, no combine
        "from dcp_a2a.reference.contract import lse_pack_dim, lse_reduce\n")
    from dcp_a2a.testing.impl import MissingFunction

    try:  # (the suite's plugin turns a MissingFunction in a test into a skip: fail instead)
        with pytest.raises(SystemExit) as e:
            numerics_report.main(["--impl", str(tmp_path / "only_dim.py"), "--out",
                                  str(tmp_path / "nr"), "--no-progress"])
    except MissingFunction as exc:
        pytest.fail(f"a MissingFunction traceback, not a usage error: {exc}")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "only_dim has no pack_send, unpack_combine" in err, err
    assert not (tmp_path / "nr").exists()


EXITS = {"exit_0": "import sys\nsys.exit(0)\n", "bare_exit": "import sys\nsys.exit()\n",
         "script": "def main():\n    pass\n\nraise SystemExit(main())\n"}


@pytest.mark.parametrize("kind", list(EXITS))
def test_an_implementation_that_exits_at_import_is_one_usage_error(tmp_path, monkeypatch, capsys,
                                                                   kind):
    """A module that exits while it is imported (a script whose main is not guarded, an adapter
    that bails out) ended validate with exit status 0: no summary, no report, a green CI job
    that tested nothing. Now a usage error naming it, before any pytest session."""
    from dcp_a2a.testing import cli

    impl = tmp_path / f"exits_{kind}.py"
    impl.write_text(EXITS[kind])
    monkeypatch.delenv("DCP_A2A_IMPL", raising=False)
    code = cli.main(["validate", "--impl", str(impl), "--quick", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == validate.EXIT_USAGE, err
    assert f"'exits_{kind}' exited while it was imported" in err, err
    assert not (tmp_path / "o" / "validation.json").exists()


def test_the_real_commands_refuse_an_implementation_that_exits(tmp_path):
    """The same through the installed commands: ``dcp-a2a validate`` exits 2 and pytest's
    entry point 4 (a usage error), where both exited 0."""
    impl = tmp_path / "exits_now.py"
    impl.write_text(EXITS["exit_0"])
    proc = _run(["validate", "--impl", str(impl), "--quick", "--out", str(tmp_path / "o")])
    assert proc.returncode == 2 and "exited while it was imported" in proc.stderr, \
        proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = _run(["-p", "dcp_a2a.testing.plugin", "--pyargs", "dcp_a2a.testing.conformance",
                 "-m", "conformance", "--co", "-q", "-p", "no:cacheprovider", "--impl", str(impl)],
                module="pytest", cwd=tmp_path)
    assert proc.returncode == 4 and "exited while it was imported" in proc.stderr, \
        proc.stdout[-2000:] + proc.stderr[-2000:]


PARTIAL = '''
"""A partial implementation: the pure-PyTorch pack and combine, no lse_reduce."""
from dcp_a2a.reference.contract import lse_pack_dim, pack_send, unpack_combine
'''


@pytest.mark.slow  # a validate run: a pytest session of the conformance subset
def test_a_partial_foreign_implementation_skips_what_it_lacks_and_reports_only_itself(tmp_path):
    """Tests that need lse_reduce skip with the reason (none fails with AttributeError); the
    project's own kernel tests are left out, so every count and error in the summary and in
    validation.md measures the implementation under test, which its first line names. The
    module lies next to the user (``--impl partial_impl`` run from its directory, as ``python -m``
    finds modules), not on PYTHONPATH: validate's pytest session runs elsewhere and imports it
    all the same."""
    (tmp_path / "partial_impl.py").write_text(textwrap.dedent(PARTIAL))
    out = tmp_path / "report"
    # the files that hold what this test reads (a kernel-tier file of the project's own, for
    # the left-out count): every conformance case of --quick would cost CI 6 s more
    files = [str(ROOT / p) for p in ("dcp_a2a/testing/conformance/test_merge.py",
                                     "dcp_a2a/testing/conformance/test_graphs.py",
                                     "tests/kernel/test_output_rounding.py")]
    proc = _run(["validate", "--impl", "partial_impl", "--quick", "--no-plots", "--no-progress",
                 "-j", "0", "--out", str(out), "--", *files], env={"PYTHONPATH": str(ROOT)},
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    described = f"partial_impl ({tmp_path / 'partial_impl.py'})"
    assert lines[0] == (f"implementation under test: {described}; lacks lse_reduce (tests "
                        "needing it skip)")
    rep = json.loads((out / "validation.json").read_text())
    assert rep["implementation"]["missing"] == ["lse_reduce"]
    skips = {t["nodeid"]: t["text"] for t in rep["tests"] if t["outcome"] == "skipped"}
    lacking = [n for n, why in skips.items() if why in (  # by its surface, or its function
        "not applicable: exchange (implementation partial_impl does not expose it)",
        "not applicable: lse_reduce (implementation partial_impl has no such function)")]
    assert any("test_group_of_one" in n for n in lacking), skips
    assert any("test_graphs" in n for n in lacking), skips
    assert not rep["failures"]
    # only tests of the implementation ran; the project's own are counted as left out
    assert all(not t["nodeid"].startswith("tests/") for t in rep["tests"]), \
        [t["nodeid"] for t in rep["tests"] if t["nodeid"].startswith("tests/")]
    kernel = next(t for t in rep["tiers"] if t["name"] == "kernel")
    assert kernel["other_code"] > 0 and "of dcp_a2a's own code left out" in proc.stdout
    subjects = {m["subject"] for t in rep["tests"] for m in t["merge_reports"]}
    assert subjects == {"partial_impl"}, subjects
    md = (out / "validation.md").read_text()
    assert f"**Implementation under test:** `partial_impl` — module `partial_impl`, file " \
           f"`{tmp_path / 'partial_impl.py'}`; lacks lse_reduce" in md


def test_evals_that_cannot_run_exit_3_at_once_naming_everything_missing(tmp_path):
    """--evals asks for the model-level jobs: without a prepared model (an empty model cache)
    and without the GSM8K data they cannot run. Its plan knew before anything ran, yet every
    tier ran first (~3.5 min) and the run ended in exit 3 with "total FAIL" over passing tiers;
    now exit 3 at once, naming each missing thing, nothing run and no report written."""
    out = tmp_path / "report"
    empty = tmp_path / "gsm8k"
    empty.mkdir()
    proc = _run(["validate", "--evals", "--tiers", "unit", "--gsm8k-dir", str(empty),
                 "--no-plots", "--no-progress", "-j", "0", "--out", str(out)],
                env={"DCP_A2A_MODEL_CACHE": str(tmp_path / "no-models"), "HOME": str(tmp_path)})
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "asked for but cannot run here: evals:logit_parity, evals:gsm8k (exit status 3; " \
           "nothing was run)" in proc.stdout
    for job in ("logit_parity", "gsm8k"):
        (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"  evals:{job}: ")]
        # every missing thing: the data and a model (none in the empty cache, unless a model
        # wheel is installed in this environment), or the modules (an install without them)
        assert (f"GSM8K data not found at {empty}" in line or "not installed" in line), line
    assert "PASS" not in proc.stdout and "FAIL" not in proc.stdout
    assert not out.exists() or not list(out.iterdir())  # no tier ran, no report


def test_a_missing_gsm8k_dir_is_a_usage_error():
    """A --gsm8k-dir that does not exist went unmentioned (the plan named the model first)."""
    proc = _run(["validate", "--evals", "--gsm8k-dir", "/nonexistent"])
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["dcp-a2a validate: error: argument --gsm8k-dir: "
                                        "/nonexistent: no such directory (see dcp-a2a validate "
                                        "--help)"], proc.stderr


def test_asking_for_the_e2e_tier_asks_for_the_evals(tmp_path, monkeypatch):
    """``--tiers e2e`` without ``--evals`` plans the model-level jobs as ``--evals`` does (the
    run of the exit-3 test above, in this form, is the same): the plan is checked in process."""
    from dcp_a2a.testing import cli, tiers

    asked = []

    def plan_tiers(machine, requested, evals, quick=False):
        asked.append((requested, evals))
        raise KeyboardInterrupt  # stop before anything runs

    monkeypatch.setattr(tiers, "plan_tiers", plan_tiers)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["validate", "--tiers", "unit,e2e", "--out", str(tmp_path)])
    assert asked == [(["unit", "e2e"], True)]


@pytest.mark.parametrize("args, named", [
    (["--gsm8k-limit", "-5"], "--gsm8k-limit"),
    (["--gsm8k-limit", "0"], "--gsm8k-limit"),
    (["--gsm8k-backends", "reference,pakced"], "pakced"),
    (["--eval-model", "gpt-17"], "gpt-17")])
def test_bad_eval_options_are_usage_errors_up_front(tmp_path, capsys, args, named):
    from dcp_a2a.testing import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["validate", "--evals", *args, "--out", str(tmp_path)])
    assert e.value.code == 2 and named in capsys.readouterr().err
    assert not (tmp_path / "validation.json").exists()


# The documented checkout forms (`pytest -m conformance -n 2 --dist loadgroup --impl
# dcp_a2a.reference.contract`, the adapter example) are collected exactly as written by
# tests/unit/test_documented_commands.py.


def test_accuracy_refuses_an_unwritable_out_before_the_first_case(tmp_path):
    proc = _run(["--out", "/proc/nope/x.json", "--shapes", "1x4x8", "--dtype", "float16"],
                module="dcp_a2a.testing.accuracy")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "argument --out: /proc/nope/x.json: its directory /proc/nope cannot be created" in \
        proc.stderr
    assert "cases" not in proc.stdout and "accuracy N=" not in proc.stderr  # no case began


def test_accuracy_with_no_case_to_run_is_a_usage_error(tmp_path):
    """--shapes restricted to another dtype than --dtype planned 0 cases and the job said
    "0 cases, 0 failed", ok, exit 0: a green accuracy job that checked nothing."""
    out = tmp_path / "acc.json"
    proc = _run(["--out", str(out), "--shapes", "4x8x24:float16", "--dtype", "float32"],
                module="dcp_a2a.testing.accuracy")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("no case to run: the shapes (4x8x24) are restricted to other dtypes than --dtype "
            "float32") in proc.stderr
    assert not out.exists() or not json.loads(out.read_text()).get("ok")


def test_accuracy_refuses_an_implementation_without_lse_reduce(tmp_path):
    """It ended in a MissingFunction traceback on every rank; now one usage line, exit 2."""
    (tmp_path / "no_reduce.py").write_text(
        "from dcp_a2a.reference.contract import lse_pack_dim, pack_send, unpack_combine\n")
    proc = _run(["--impl", str(tmp_path / "no_reduce.py"), "--shapes", "1x4x8", "--dtype",
                 "float16"], module="dcp_a2a.testing.accuracy")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "error: no_reduce has no lse_reduce" in proc.stderr and "Traceback" not in \
        proc.stderr, proc.stderr[-2000:]


KEEPS_CASES = '''
import sys
from dcp_a2a.testing import accuracy

real, calls = accuracy.check_slice, []


def check_then_die(*args, **kwargs):  # the job dies in its third case
    calls.append(1)
    if len(calls) == 3:
        raise RuntimeError("the GPU job died here")
    return real(*args, **kwargs)


accuracy.check_slice = check_then_die
sys.exit(accuracy.main(sys.argv[1:]))
'''


def test_accuracy_keeps_the_cases_it_finished_when_the_job_dies(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(KEEPS_CASES)
    out = tmp_path / "acc.json"
    proc = subprocess.run([sys.executable, str(script), "--backend", "packed", "--dtype",
                           "float16", "--base", "e", "--shapes", "1x4x8,2x4x8,3x4x8", "--out",
                           str(out), "--quiet"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode != 0 and "the GPU job died here" in proc.stderr
    rep = json.loads(out.read_text())
    assert rep["complete"] is False and rep["ok"] is False
    assert [c["shape"] for c in rep["cases"]] == ["1x4x8", "2x4x8"]
    assert rep["meta"]["cases_planned"] == 3


def test_validate_offers_the_gsm8k_drivers_backends():
    """--gsm8k-backends is checked against the driver's own list (kept in step here, because
    the driver's module imports lm-eval and the check runs before anything heavy)."""
    gsm8k = pytest.importorskip("dcp_a2a.evals.gsm8k")

    assert validate.eval_backends() == tuple(gsm8k.BACKENDS)


ADAPTER = "from dcp_a2a.reference.contract import lse_pack_dim, pack_send, unpack_combine, " \
          "lse_reduce\n"


def test_a_file_spec_is_loaded_from_its_directory(tmp_path, monkeypatch):
    """``--impl path/to/adapter.py[:attr]``: module form for the processes started later (their
    working directory differs), the directory on sys.path and on PYTHONPATH, which they
    inherit; a file that does not exist is a usage error naming it."""
    from dcp_a2a.testing import impl as impl_mod

    src = tmp_path / "somewhere"
    src.mkdir()
    (src / "file_adapter.py").write_text(ADAPTER + "class Obj:\n    lse_pack_dim = "
                                         "staticmethod(lse_pack_dim)\n    unpack_combine = "
                                         "staticmethod(unpack_combine)\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.chdir(tmp_path)
    got = impl_mod.load_impl("somewhere/file_adapter.py:Obj")
    assert got.spec == "file_adapter:Obj" and got.missing() == ["pack_send", "lse_reduce"]
    assert got.file == str(src / "file_adapter.py")
    child = subprocess.run([sys.executable, "-c", "import importlib.util, sys; sys.exit("
                            "importlib.util.find_spec('file_adapter') is None)"], cwd="/",
                           env=dict(os.environ), capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    with pytest.raises(ValueError, match="implementation file 'nowhere/x.py' does not exist"):
        impl_mod.load_impl("nowhere/x.py")


def test_a_package_directory_spec_is_loaded_like_a_file(tmp_path, monkeypatch):
    """``--impl path/to/pkg[/][:attr]`` (a directory with __init__.py) was "No module named
    '/path/to/pkg'": now its module form, the parent directory on the path as for a file; a
    directory that is not a package is a usage error naming the path."""
    from dcp_a2a.testing import impl as impl_mod

    pkg = tmp_path / "src" / "dir_adapter"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(ADAPTER)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.chdir(tmp_path)
    for spec in ("src/dir_adapter", "src/dir_adapter/", str(pkg)):
        got = impl_mod.load_impl(spec)
        assert got.spec == "dir_adapter" and got.missing() == [], spec
        assert got.file == str(pkg / "__init__.py")
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "src")
    with pytest.raises(ValueError, match="'src/' is neither a .py file nor a package directory"):
        impl_mod.load_impl("src/")


def test_a_worker_that_inherits_the_path_late_imports_the_file_module(tmp_path, monkeypatch):
    """An xdist worker gets the module form and the controller's PYTHONPATH, but its sys.path
    was fixed before the controller put the file's directory there (``pytest -n 2 --impl
    path/to/adapter.py`` failed every test with "No module named 'adapter'")."""
    from dcp_a2a.testing import impl as impl_mod

    (tmp_path / "late_adapter.py").write_text(ADAPTER)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir("/")
    assert impl_mod.load_impl("late_adapter").missing() == []


@pytest.mark.parametrize("source, says", [
    ('raise RuntimeError("CUDA driver too old")\n',
     "importing implementation module 'broken_at_import' raised RuntimeError: CUDA driver too "
     "old ("),
    ("import no_such_dependency_xyz\n",
     "implementation module 'broken_at_import' was found, but importing it failed: No module "
     "named 'no_such_dependency_xyz'")])
def test_an_implementation_that_fails_to_import_is_one_usage_error(tmp_path, monkeypatch, capsys,
                                                                   source, says):
    """Its own code raising at import (or a dependency it lacks) is named in one line, exit 2,
    not a traceback from validate or an INTERNALERROR from pytest."""
    from dcp_a2a.testing import cli

    (tmp_path / "broken_at_import.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delitem(sys.modules, "broken_at_import", raising=False)
    code = cli.main(["validate", "--impl", "broken_at_import", "--quick", "--out",
                     str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "validation.json").exists()
