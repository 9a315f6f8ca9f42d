"""The eval commands' arguments, as a user meets them: a bad value is a usage error -- exit
status 2, one line naming the option -- before anything is loaded (the table of bad values
through each command's ``main``, each command once for real in a subprocess); and the help of
``python -m dcp_a2a.evals.lm_eval_model`` is the flat command its own example runs. (The GSM8K
driver's stderr outside a checkout: tests/e2e/test_drivers.py.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def _run(module, *argv, cwd, env=None, timeout=120):
    """The installed command (cwd: a directory of no checkout, so that ``python -m`` finds
    the installed package, not one in the working directory)."""
    return subprocess.run([sys.executable, "-m", f"dcp_a2a.evals.{module}", *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})


# Each case ran on before: --dcp-size 0 silently as N = 3, --limit -3 into lm-eval after the
# model load, --backends packed,packed twice. Here they would reach the model check (an
# unprepared model in an empty cache: a different one-line error), never the model itself.
BAD = [
    ("gsm8k", ["--dcp-size", "0"], "argument --dcp-size: expected a whole number >= 1, got '0'"),
    ("gsm8k", ["--limit", "-3"], "argument --limit: expected a whole number >= 1, got '-3'"),
    ("gsm8k", ["--backends", "packed,packed"], "argument --backends: backend packed given twice"),
    ("gsm8k", ["--device", "cuda:7"], "argument --device: cuda:7: "),
    ("logit_parity", ["--dcp-size", "0"], "argument --dcp-size: expected a whole number >= 1"),
    ("logit_parity", ["--backends", "packed,nccl"],
     "argument --backends: unknown backend 'nccl'; expected some of packed, two_collective"),
    ("logit_parity", ["--dtypes", "float32,fp8"], "argument --dtypes: unknown dtype 'fp8'"),
    # an --out that cannot be created failed only when the results were written, after the run
    ("gsm8k", ["--out", "/proc/nope/o"], "argument --out: /proc/nope/o cannot be created"),
    ("logit_parity", ["--out", "/proc/nope/o"], "argument --out: /proc/nope/o cannot be created"),
]


def _one_usage_line(module, code, out, err, message):
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"python -m dcp_a2a.evals.{module}: error: {message}"), lines[0]
    assert out == ""


@pytest.mark.parametrize("module,argv,message", BAD, ids=[" ".join(a) for _, a, _ in BAD])
def test_a_bad_argument_is_one_usage_line_before_anything_loads(module, argv, message,
                                                                tmp_path, monkeypatch, capsys):
    """Through the command's own ``main`` (argument checks are the same code in any process;
    the next test runs each command for real)."""
    import importlib

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DCP_A2A_MODEL_CACHE", str(tmp_path / "empty"))
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"dcp_a2a.evals.{module}").main(
            ["--model", "qwen2.5-coder-0.5b", *argv])
    captured = capsys.readouterr()
    _one_usage_line(module, exit_.value.code, captured.out, captured.err, message)


@pytest.mark.parametrize("module", sorted({m for m, _, _ in BAD}))
def test_each_command_refuses_a_bad_argument_in_one_line_when_run(module, tmp_path):
    """The real command, in a subprocess: its exit status, and nothing on stderr but the line
    (no traceback, no warning of an import)."""
    _, argv, message = next(case for case in BAD if case[0] == module)
    proc = _run(module, "--model", "qwen2.5-coder-0.5b", *argv, cwd=tmp_path,
                env={"DCP_A2A_MODEL_CACHE": str(tmp_path / "empty")})
    _one_usage_line(module, proc.returncode, proc.stdout, proc.stderr, message)


@pytest.mark.e2e
def test_lm_eval_model_help_is_the_flat_command_of_its_example(capsys):
    """--help shows the options its example uses, as this command takes them (no lm-eval
    subcommand), and the example parses with them. (Through its ``main``: the next test runs
    the command.)"""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (the test extra has it)")
    from dcp_a2a.evals import lm_eval_model as lm
    from dcp_a2a.evals.model import MODELS

    with pytest.raises(SystemExit) as exit_:
        lm.main(["--help"])
    assert exit_.value.code in (0, None)
    out = capsys.readouterr().out
    assert "usage: python -m dcp_a2a.evals.lm_eval_model --model dcp-hf" in out
    assert "COMMAND" not in out and "lm-eval run" not in out
    example = re.search(r"^    (python -m dcp_a2a\.evals\.lm_eval_model .*?)\n\n",
                        lm.__doc__, re.S | re.M).group(1).replace("\\\n", " ")
    argv = shlex.split(example)[3:]
    assert argv == shlex.split(lm.EXAMPLE)[3:]  # the docstring and the help's example agree
    options = set(re.findall(r"^\s+(--[a-z_]+)", out, re.M))
    used = [a for a in argv if a.startswith("--")]
    assert used and not set(used) - options, set(used) - options
    ns = lm.run_parser().parse_args(argv)  # lm-eval's own parser takes the example as given
    assert ns.model == "dcp-hf" and "gsm8k_local" in str(ns.tasks)
    for name in MODELS:  # and the model_args list names every registered model
        assert name in out, name


@pytest.mark.e2e
def test_lm_eval_model_names_an_unknown_model_in_one_line(tmp_path):
    """``model=nope`` in --model_args was a ValueError traceback; one usage line now."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (the test extra has it)")
    proc = _run("lm_eval_model", "--model", "dcp-hf", "--model_args", "model=nope,dcp_size=4",
                "--tasks", "gsm8k_local", "--limit", "1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert lines == ["python -m dcp_a2a.evals.lm_eval_model: error: unknown model 'nope': "
                     "expected one of smollm2, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b"], lines
