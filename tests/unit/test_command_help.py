"""Every program explains itself: ``dcp-a2a --help`` lists every program, each program's
``--help`` names the command as it is typed and gives every option a help text."""

from __future__ import annotations

import pytest

from dcp_a2a.testing import cli

pytestmark = pytest.mark.unit


def test_the_top_help_lists_every_program(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage: dcp-a2a ")
    for command in ("validate", "accuracy", "bench", "self-check", "gpu-check", "engines"):
        assert f"    {command}" in out, command
    assert "torchrun --nproc-per-node N -m dcp_a2a accuracy" in out
    assert "torchrun --nproc-per-node N -m dcp_a2a bench --collective" in out


@pytest.mark.parametrize("command", list(cli.PROGRAMS))
def test_every_option_has_help(command):
    _, subs = cli.build_parser()
    parser = subs[command]
    assert parser.prog == f"dcp-a2a {command}"
    bare = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert not bare, f"options without help: {bare}"
    assert parser.format_help().startswith(f"usage: dcp-a2a {command}")


@pytest.mark.parametrize("module, command", [("dcp_a2a.testing.accuracy", "accuracy"),
                                             ("dcp_a2a.testing.bench", "bench"),
                                             ("dcp_a2a.testing.selfcheck", "self-check")])
def test_the_old_module_paths_run_the_same_program(module, command, capsys):
    """``python -m dcp_a2a.testing.accuracy`` (and .bench, .selfcheck) are in users' scripts:
    they run ``dcp-a2a COMMAND`` itself, whose usage they show."""
    import importlib

    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main(["--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: dcp-a2a {command} ")


def test_accuracy_table_has_a_legend():
    from dcp_a2a.testing import accuracy_report

    report = {"meta": {"world_size": 2, "dist_backend": "gloo", "device": "cpu",
                       "triton_interpreter": True, "implementation": "dcp_a2a",
                       "skipped_shapes": []},
              "cases": [{"backend": "ag_rs", "dtype": "bfloat16", "shape": "1x8x40", "base": "e",
                         "output": {"max_abs_err": 1e-2, "max_ulp_err": 155.0,
                                    "worst_ratio": 0.4},
                         "lse": {"max_abs_err": 1e-7, "worst_ratio": 0.1}, "seconds": 0.01,
                         "ok": True, "ratio_vs_a2a_bound": 121.0,
                         "lse_dtype": "bfloat16", "empty_rows": 7}]}
    table = accuracy_report.format_table(report)
    assert "(vs A2A tol 121)" in table and accuracy_report.LEGEND in table
    row = table.splitlines()[3].split()
    assert row[4:6] == ["bfloat16", "7"], row
    for c in report["cases"]:  # a report written before those columns still prints
        del c["lse_dtype"], c["empty_rows"]
    assert accuracy_report.format_table(report).splitlines()[3].split()[4:6] == ["-", "-"]
    assert "ag_rs sums in the output dtype" in table


def test_a_case_the_implementation_raised_in_is_a_failing_row_that_names_it():
    """A rank on which the implementation raised: the row fails naming the rank and the
    exception (the job went on to the next case; a traceback per rank before)."""
    from dcp_a2a.testing import accuracy_report as ar

    base = {"backend": "default", "dtype": "float32", "shape": "1x4x8", "b": 1, "h": 4, "d": 8,
            "base": "e", "lse_dtype": "float32", "empty_rows": 0}
    (row,) = ar.merge_rows([[dict(base, error="TypeError: no")]] * 2)
    assert row["ok"] is False and row["error"] == "rank 0: TypeError: no; rank 1: TypeError: no"
    report = ar._report({"world_size": 2, "dist_backend": "gloo", "device": "cpu",
                         "triton_interpreter": True, "implementation": "m",
                         "skipped_shapes": []}, [row], complete=True)
    assert not report["ok"] and ar.exit_status(report) == 1
    assert "FAIL  the implementation raised: rank 0: TypeError: no" in ar.format_table(report)
    (na,) = ar.merge_rows([[dict(base, not_applicable="no base-2")]] * 2)
    report = ar._report(report["meta"], [na], complete=True)
    assert na["ok"] is None and not report["ok"] and ar.exit_status(report) == 5
