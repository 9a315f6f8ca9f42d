"""Every documented command explains itself: --help names the command as it is run and gives
every option a help text."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("module", ["dcp_a2a.testing.bench", "dcp_a2a.testing.accuracy"])
def test_every_option_has_help(module):
    import importlib

    parser = importlib.import_module(module).build_parser()
    assert parser.prog == f"python -m {module}"
    bare = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert not bare, f"options without help: {bare}"
    assert parser.format_help().startswith(f"usage: python -m {module}")


def test_accuracy_table_has_a_legend():
    from dcp_a2a.testing import accuracy

    report = {"meta": {"world_size": 2, "dist_backend": "gloo", "device": "cpu",
                       "triton_interpreter": True, "implementation": "dcp_a2a",
                       "skipped_shapes": []},
              "cases": [{"backend": "ag_rs", "dtype": "bfloat16", "shape": "1x8x40", "base": "e",
                         "output": {"max_abs_err": 1e-2, "max_ulp_err": 155.0,
                                    "worst_ratio": 0.4},
                         "lse": {"max_abs_err": 1e-7, "worst_ratio": 0.1}, "seconds": 0.01,
                         "ok": True, "ratio_vs_a2a_bound": 121.0,
                         "lse_dtype": "bfloat16", "empty_rows": 7}]}
    table = accuracy.format_table(report)
    assert "(vs A2A tol 121)" in table and accuracy.LEGEND in table
    row = table.splitlines()[3].split()
    assert row[4:6] == ["bfloat16", "7"], row
    for c in report["cases"]:  # a report written before those columns still prints
        del c["lse_dtype"], c["empty_rows"]
    assert accuracy.format_table(report).splitlines()[3].split()[4:6] == ["-", "-"]
    assert "ag_rs sums in the output dtype" in table
