"""Every bad value of every flag of every ``dcp-a2a`` program is one line on stderr --
``dcp-a2a PROGRAM: error: what is wrong; what is allowed`` -- and exit status 2, before any work
starts: a table of (program, flags, what the line says), each row run through ``dcp-a2a``'s own
``main`` in this process with the entry points of the work replaced by a tripwire; then a few
real processes (``python -m``, the old module paths, torchrun ranks).

Before, of these rows: accuracy ran with --warmup -1, --spread nan/inf (every LSE NaN, the case
"ok"), --iters 0/-5 (one iteration), --shapes '' (the default sweep), --out '' (no report),
--dtype float32,float32 (a case twice), a 100000000x128x512 shape (an allocator's traceback
after minutes) and an implementation taking the wrong arguments (a TypeError per rank);
validate wrote into the working directory with --out '' and ran every tier before refusing
--evals it could not run; the self-check ran minutes of runs with --jobs -1, --parallel 0,
--timeout -5/0/nan, --marker 'not (' (blamed on a mutant) and --mutants os; bench --collective
outside torchrun was a 26-line traceback, its --shapes unchecked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

WRONG_ARGS = '''
from dcp_a2a.reference.contract import lse_pack_dim, pack_send, unpack_combine


def lse_reduce(out, lse):  # the contract's is lse_reduce(out, lse, group, *, return_lse, ...)
    return out
'''


class WorkStarted(BaseException):
    """What the tripwire raises (a BaseException: no ``except Exception`` of a program hides
    it)."""


@pytest.fixture
def tripwire(monkeypatch, tmp_path):
    """Every entry point of the programs' work raises :class:`WorkStarted`; the environment is
    restored afterwards (the accuracy job sets torchrun's variables for a group of one)."""
    import torch.distributed as dist

    from dcp_a2a.testing import conformance_run, evaljobs, gpucheck, sessions

    def started(*a, **k):
        raise WorkStarted()

    for mod, name in ((sessions, "run_pytest"), (evaljobs, "run_eval"),
                      (dist, "init_process_group"), (conformance_run, "run_one"),
                      (gpucheck, "run_schedule")):
        monkeypatch.setattr(mod, name, started)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "DCP_A2A_IMPL"):
        monkeypatch.delenv(var, raising=False)
    saved = dict(os.environ)
    (tmp_path / "a_file").write_text("")
    (tmp_path / "wrong_args.py").write_text(WRONG_ARGS)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved)


F = "a_file"  # a file where a directory is wanted (made by the tripwire fixture)
ROWS = [
    # validate
    ("validate", ["--out", ""], "argument --out: '': is empty"),
    ("validate", ["--out", F], "argument --out: a_file: exists and is not a directory"),
    ("validate", ["--out", "/proc/nope/x"], "argument --out: /proc/nope/x: cannot be created"),
    ("validate", ["--tiers", ""], "argument --tiers: an empty tier in ''"),
    ("validate", ["--tiers", "unit,unit"], "argument --tiers: tier unit given twice"),
    ("validate", ["--tiers", "bogus"], "argument --tiers: unknown tier 'bogus'; expected a comma "
                                       "list of unit, kernel"),
    ("validate", ["--gsm8k-dir", "/nonexistent", "--evals"],
     "argument --gsm8k-dir: /nonexistent: no such directory"),
    ("validate", ["--gsm8k-dir", "", "--evals"], "argument --gsm8k-dir: is empty"),
    ("validate", ["--gsm8k-dir", F, "--evals"], "argument --gsm8k-dir: a_file: not a directory"),
    ("validate", ["--gsm8k-limit", "0", "--evals"], "argument --gsm8k-limit: expected a whole "
                                                    "number from 1 to 1319, got '0'"),
    ("validate", ["--gsm8k-limit", "1000000000000", "--evals"],
     "argument --gsm8k-limit: expected a whole number from 1 to 1319"),
    ("validate", ["--gsm8k-limit", "nan", "--evals"], "argument --gsm8k-limit: expected a whole"),
    ("validate", ["--gsm8k-limit", "5"], "--gsm8k-limit only with --evals"),
    ("validate", ["--eval-model", "smollm2"], "--eval-model only with --evals"),
    ("validate", ["--gsm8k-backends", "packed,packed", "--evals"],
     "argument --gsm8k-backends: backend packed given twice"),
    ("validate", ["--eval-model", "", "--evals"], "argument --eval-model: unknown model ''"),
    ("validate", ["-j", "-1"], "argument -j/--workers: expected auto or a whole number from 0"),
    ("validate", ["-j", "1000000"], "argument -j/--workers: expected auto or a whole number"),
    ("validate", ["--suite", ""], "argument --suite: is empty"),
    ("validate", ["--suite", "."], "argument --suite: .: no tests/ directory there"),
    ("validate", ["--stall-timeout", "inf"], "argument --stall-timeout: expected a finite number "
                                             "of seconds >= 0, got 'inf' (0: never)"),
    ("validate", ["--stall-timeout", "nan"], "argument --stall-timeout: expected a finite"),
    ("validate", ["--impl", ""], "--impl is empty (an unset variable?)"),
    # accuracy
    ("accuracy", ["--warmup", "-1"], "argument --warmup: expected a whole number from 0 to 10000, "
                                     "got '-1'"),
    ("accuracy", ["--warmup", "1000000000"], "argument --warmup: expected a whole number from 0 "
                                             "to 10000"),
    ("accuracy", ["--iters", "0"], "argument --iters: expected a whole number from 1 to 10000, "
                                   "got '0'"),
    ("accuracy", ["--iters", "-5"], "argument --iters: expected a whole number from 1"),
    ("accuracy", ["--spread", "-1"], "argument --spread: expected a finite spread >= 0"),
    ("accuracy", ["--spread", "nan"], "argument --spread: expected a finite spread >= 0 and <= "
                                      "1e+30, got 'nan'"),
    ("accuracy", ["--spread", "inf"], "argument --spread: expected a finite spread"),
    ("accuracy", ["--spread", "1e300"], "argument --spread: expected a finite spread"),
    ("accuracy", ["--seed", "-1"], "argument --seed: expected a whole number from 0 to "
                                   "4294967295, got '-1'"),
    ("accuracy", ["--seed", "99999999999999999999999"], "argument --seed: expected a whole"),
    ("accuracy", ["--shapes", ""], "argument --shapes: an empty shape in ''"),
    ("accuracy", ["--shapes", "bogus"], "argument --shapes: bad shape 'bogus': expected "
                                        "BxHxD[:dtype]"),
    ("accuracy", ["--shapes", "1x8x0"], "argument --shapes: bad shape '1x8x0': need D >= 1"),
    ("accuracy", ["--shapes=-1x8x8"], "argument --shapes: bad shape '-1x8x8': need B >= 0"),
    ("accuracy", ["--shapes", "1x8x8,1x8x8"], "argument --shapes: shape 1x8x8 given twice"),
    ("accuracy", ["--dtype", "float32,float32"], "argument --dtype: dtype float32 given twice"),
    ("accuracy", ["--dtype", ""], "argument --dtype: an empty dtype"),
    ("accuracy", ["--backend", "packed,packed"], "argument --backend: backend packed given twice"),
    ("accuracy", ["--out", ""], "argument --out: '': is empty (name a file)"),
    ("accuracy", ["--out", "."], "argument --out: .: is a directory (name a file)"),
    ("accuracy", ["--out", "/proc/nope/x.json"], "argument --out: /proc/nope/x.json: its "
                                                 "directory /proc/nope cannot be created"),
    ("accuracy", ["--impl", ""], "argument --impl: empty; expected an implementation spec"),
    ("accuracy", ["--shapes", "100000000x128x512", "--dtype", "bfloat16", "--base", "e"],
     "shape 100000000x128x512 (bfloat16) needs about "),
    ("accuracy", ["--impl", "wrong_args.py", "--shapes", "1x4x8"],
     "wrong_args's lse_reduce does not take the contract's arguments (out, lse, group, *, "
     "return_lse, is_lse_base_on_e)"),
    ("accuracy", ["--shapes", "2x3x8:float16", "--dtype", "float32"],
     "no case to run: the shapes (2x3x8) are restricted to other dtypes than --dtype float32"),
    # bench
    ("bench", ["--out", ""], "argument --out: '': is empty"),
    ("bench", ["--grid", "--rounds", "0"], "argument --rounds: expected a whole number from 1"),
    ("bench", ["--grid", "--settle-rounds", "-1"], "argument --settle-rounds: expected a whole "
                                                   "number from 0"),
    ("bench", ["--grid", "--target", "nan"], "argument --target: expected a finite ratio > 0"),
    ("bench", ["--grid", "--target", "inf"], "argument --target: expected a finite ratio > 0"),
    ("bench", ["--grid", "--tables", "table,table"], "argument --tables: launch table table "
                                                     "given twice"),
    ("bench", ["--tables", "table"], "argument --tables: only with --grid"),
    ("bench", ["--rounds", "5"], "argument --rounds: only with --grid"),
    ("bench", ["--shapes", "2x4"], "argument --shapes: only with --collective"),
    ("bench", ["--collective", "--sweep"], "argument --sweep: not with --collective"),
    ("bench", ["--collective", "--quick"], "argument --quick: not with --collective"),
    ("bench", ["--grid", "--collective"], "argument --collective: not allowed with argument "
                                          "--grid"),
    ("bench", ["--collective", "--shapes", "bogus"], "argument --shapes: bad shape 'bogus': "
                                                     "expected BxH"),
    ("bench", ["--collective", "--shapes", "2x4,2x4"], "argument --shapes: shape 2x4 given "
                                                       "twice"),
    ("bench", ["--collective", "--head-dim", "0"], "argument --head-dim: expected a whole number "
                                                   ">= 1, got '0'"),
    ("bench", ["--collective", "--iters", "0"], "argument --iters: expected a whole number from 1"),
    ("bench", ["--collective", "--shapes", "2x4"],
     "--collective times the exchange between ranks: run it under torchrun"),
    ("bench", ["--eager-calls", "0"], "argument --eager-calls: expected a whole number from 1"),
    ("bench", ["--eager-repeats", "1000000000"], "argument --eager-repeats: expected a whole"),
    # self-check
    ("self-check", ["--jobs", "-1"], "argument --jobs/-n: expected a whole number from 1"),
    ("self-check", ["--mutant-jobs", "0"], "argument --mutant-jobs: expected a whole number"),
    ("self-check", ["--parallel", "0"], "argument --parallel: expected a whole number from 1"),
    ("self-check", ["--parallel", "1000000"], "argument --parallel: expected a whole number"),
    ("self-check", ["--correct-parallel", "0"], "argument --correct-parallel: expected a whole"),
    ("self-check", ["--timeout", "-5"], "argument --timeout: expected a finite number of seconds "
                                        "> 0, got '-5'"),
    ("self-check", ["--timeout", "0"], "argument --timeout: expected a finite number of seconds"),
    ("self-check", ["--timeout", "nan"], "argument --timeout: expected a finite number"),
    ("self-check", ["--marker", "not ("], "argument --marker: 'not (' is not a pytest -m "
                                          "expression at column"),
    ("self-check", ["--marker", ""], "argument --marker: is empty"),
    ("self-check", ["--only", "x", "x"], "argument --only: x given twice"),
    ("self-check", ["--only", "bogus"], "argument --only: unknown mutant(s) bogus"),
    ("self-check", ["--correct", "dcp_a2a", "dcp_a2a"], "argument --correct: dcp_a2a given twice"),
    ("self-check", ["--paths", "/nonexistent"], "argument --paths: /nonexistent: no such file"),
    ("self-check", ["--json", ""], "argument --json: '': is empty"),
    ("self-check", ["--workdir", F], "argument --workdir: a_file: exists and is not a directory"),
    ("self-check", ["--mutants", "os", "--no-mutants"], "argument --no-mutants: not with "
                                                         "--mutants"),
    ("self-check", ["--correct", "--mutants", "os"], "cannot load os: ValueError: os ("),
    # gpu-check
    ("gpu-check", ["--out", ""], "argument --out: '': is empty"),
    ("gpu-check", ["-j", "-1"], "argument -j/--workers: expected auto or a whole number"),
    ("gpu-check", ["--skip", "bench", "bench"], "argument --skip: bench given twice"),
    ("gpu-check", ["--skip", "bogus"], "argument --skip: invalid choice: 'bogus'"),
    # engines
    # (engines declares its flags with plain types: the shared rules reach them by kind)
    ("engines", ["--engine", "vllm", "--engine", "vllm"], "argument --engine: vllm given twice"),
    ("engines", ["--engine", ""], "argument --engine: empty"),
    ("engines", ["--out", ""], "argument --out: '': is empty"),
    ("engines", ["--out", F], "argument --out: a_file: exists and is not a directory"),
    ("engines", ["-j", "0"], "argument -j/--workers: expected a whole number from 1"),
    ("engines", ["--tiers", "unit,unit"], "argument --tiers: tier unit given twice"),
    ("engines", ["--tiers", "bogus"], "argument --tiers: unknown tier 'bogus'"),
    ("engines", ["--releases", "/nonexistent"], "argument --releases: /nonexistent: no such "
                                                "directory"),
    ("engines", ["--doc", "/nonexistent.md"], "argument --doc: /nonexistent.md: no such file"),
    ("engines", ["--from-report", "."], "argument --from-report: .: not a file"),
    # tune
    ("tune", ["--confidence", "1"], "argument --confidence: expected a finite confidence > 0 "
                                    "and < 1, got '1'"),
    ("tune", ["--confidence", "nan"], "argument --confidence: expected a finite confidence"),
    ("tune", ["--rounds", "1"], "argument --rounds: expected a whole number >= 2, got '1'"),
    ("tune", ["--screen-rounds", "0"], "argument --screen-rounds: expected a whole number >= 1"),
    ("tune", ["--finalists", "-1"], "argument --finalists: expected a whole number >= 1"),
    ("tune", ["--budget", "inf"], "argument --budget: expected a finite number of seconds > 0"),
    ("tune", ["--out", ""], "argument --out: '': is empty"),
    ("tune", ["--out", F], "argument --out: a_file: exists and is not a directory"),
]


@pytest.mark.parametrize("program, argv, says", ROWS,
                         ids=[f"{p} {' '.join(a)}" for p, a, _ in ROWS])
def test_a_bad_value_is_one_line_and_exit_2_before_any_work(program, argv, says, tripwire,
                                                            capsys):
    from dcp_a2a.testing import cli

    try:
        code = cli.main([program, *argv])
    except SystemExit as e:
        code = e.code
    except WorkStarted:
        pytest.fail(f"dcp-a2a {program} {' '.join(argv)}: the work started")
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert err.splitlines() == [err.strip()] and err.startswith(f"dcp-a2a {program}: error: "), err
    assert says in err, err
    assert out == ""


def test_evals_that_cannot_run_are_refused_before_any_tier(tripwire, capsys, monkeypatch):
    """--evals where the plan already knows the evals cannot run (another --impl here): exit 3
    at once, naming why; not a tier run (every tier ran first, ~3.5 min, then exit 3)."""
    from dcp_a2a.testing import cli

    code = cli.main(["validate", "--evals", "--impl", "dcp_a2a.reference.contract", "--out",
                     "report"])
    out = capsys.readouterr().out
    assert code == 3
    assert "asked for but cannot run here: evals:logit_parity, evals:gsm8k (exit status 3; " \
           "nothing was run)" in out
    assert "they cannot measure --impl dcp_a2a.reference.contract" in out
    assert not (tripwire / "report").exists()


def test_a_tier_that_cannot_run_here_is_refused_before_the_others(tripwire, capsys):
    import torch

    from dcp_a2a.testing import cli

    if torch.cuda.is_available():
        pytest.skip("the gpu tier runs here")
    code = cli.main(["validate", "--tiers", "unit,gpu", "--out", "report"])
    assert code == 3 and "  gpu: no CUDA GPU" in capsys.readouterr().out


def test_only_rank_0_prints_under_torchrun(tripwire, capsys, monkeypatch):
    """Every rank checks its arguments before the group starts and exits 2; one line in all."""
    from dcp_a2a.testing import cli

    for rank, lines in (("1", 0), ("0", 1)):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(SystemExit) as e:
            cli.main(["accuracy", "--shapes", "bogus"])
        assert e.value.code == 2
        assert len(capsys.readouterr().err.splitlines()) == lines


def test_a_silent_rank_leaves_rank_0_time_to_print(tripwire, capsys, monkeypatch):
    """torchrun stops every rank once one exits with an error: a silent rank that exits at once
    can take rank 0's line with it (rank 0 slower to start on a loaded machine, and no line at
    all). Under torchrun a silent rank waits for torchrun to stop it; rank 0 does not wait."""
    import time

    from dcp_a2a.testing import args, cli

    waited = []
    monkeypatch.setattr(time, "sleep", waited.append)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, waits in (("1", [args.RANK_WAIT_S]), ("0", [])):
        waited.clear()
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit):
            cli.main(["accuracy", "--shapes", "bogus"])
        assert waited == waits, rank
    assert args.RANK_WAIT_S >= 60  # long enough for a rank's torch import on a loaded machine


def _run(*argv, env=None, timeout=300):
    full = {k: v for k, v in os.environ.items() if k not in ("DCP_A2A_IMPL", "RANK",
                                                             "WORLD_SIZE")}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=full | (env or {}))


@pytest.mark.parametrize("argv, says", [
    (["-m", "dcp_a2a", "accuracy", "--spread", "nan"], "dcp-a2a accuracy: error: argument "
                                                       "--spread: expected a finite spread"),
    # the old module paths, as users' scripts have them
    (["-m", "dcp_a2a.testing.bench", "--collective", "--shapes", "2x4"],
     "dcp-a2a bench: error: --collective times the exchange between ranks: run it under "
     "torchrun"),
    (["-m", "dcp_a2a.testing.selfcheck", "--timeout", "nan"],
     "dcp-a2a self-check: error: argument --timeout: expected a finite number of seconds"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_real_commands_say_it_in_one_line(argv, says):
    proc = _run(*argv)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr[-3000:]
    assert proc.stderr.startswith(says), proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow  # two ranks started by torchrun (a torch start-up each)
def test_torchrun_ranks_refuse_bad_shapes_before_the_group_starts():
    """Under torchrun each rank checked --shapes only after the process group started: a
    traceback per rank. Now every rank refuses before it, and one line says why."""
    proc = _run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                "dcp_a2a", "accuracy", "--shapes", "bogus", "--dist-backend", "gloo",
                env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    ours = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "dcp-a2a accuracy" in ln]
    assert ours == ["dcp-a2a accuracy: error: argument --shapes: bad shape 'bogus': expected "
                    "BxHxD[:dtype], e.g. 16x128x512 (see dcp-a2a accuracy --help)"], ours
    # torchrun prints its own traceback (ChildFailedError); no frame of ours is in any output
    frames = [ln for ln in (proc.stdout + proc.stderr).splitlines()
              if ln.strip().startswith('File "') and "dcp_a2a" in ln]
    assert not frames, frames
