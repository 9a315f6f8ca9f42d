"""The accuracy job (``torchrun -m dcp_a2a accuracy``): launched for real with torchrun on 2 and 4
gloo ranks, run in-process on the pool (N = 3, and a deliberately broken implementation that it
must reject), its argument handling, and a correct implementation passing wherever it is
imported from (the caller's PYTHONPATH, the caller's working directory)."""

from __future__ import annotations

import json
import os

import pytest

from dcp_a2a.testing import accuracy, accuracy_cases, accuracy_report
from dcp_a2a.testing import tasks as mp_tasks
from dcp_a2a.testing.childenv import child_env
from tests.multiproc._procs import run_torchrun

pytestmark = pytest.mark.multiproc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = "1x8x40"   # B = 1 (decode), D = 40: not a power of two
# A launch costs a torch start-up per rank (about 3 CPU-s each, much more than the cases): one
# launch per world size, few cases. Every dtype with base e on 2 ranks, bfloat16 with base 2 on
# 4; both bases of every dtype run through the same job on the pool (N = 3, float16, and the
# tier's lse_reduce tests).
CASE_ARGS = {2: ["--base", "e"], 4: ["--dtype", "bfloat16", "--base", "2"]}


def _expected_cases(shapes: str, dtypes, n_backends: int, bases: int = 2) -> int:
    total = 0
    for s in accuracy_cases.parse_shapes(shapes):
        total += (1 if s.dtype else len(dtypes)) * bases * n_backends
    return total


def _check_report(report, world, shapes, n_backends=3, dtypes=tuple(accuracy.DTYPES),
                  bases=("e", "2")):
    assert report["meta"]["world_size"] == world
    assert report["ok"] is True
    cases = report["cases"]
    assert len(cases) == _expected_cases(shapes, dtypes, n_backends, len(bases))
    assert {c["dtype"] for c in cases} == set(dtypes)
    assert {c["base"] for c in cases} == set(bases)
    for c in cases:
        assert c["ok"], c
        assert 0 <= c["output"]["worst_ratio"] <= 1, c
        # from B = 3 a case is an engine's batch: a padding row (on every rank), empty shards
        assert (c["empty_rows"] > world) == (c["b"] >= 3), c
        sixteen_bit_base_2 = c["base"] == "2" and c["dtype"] != "float32"
        assert c["lse_dtype"] == (c["dtype"] if sixteen_bit_base_2 else "float32"), c
        assert c["output"]["elements"] == c["b"] * c["h"] * c["d"], c
        assert c["lse"]["elements"] == c["b"] * c["h"], c
        assert c["seconds"] > 0
        if c["backend"] in accuracy.BITWISE_EQUAL_TO_PACKED:
            assert c["bitwise_eq_packed"] is True
        if c["backend"] == "ag_rs":
            assert "ratio_vs_a2a_bound" in c


def _rank_env() -> dict:
    """The ranks' environment: the checkout first on PYTHONPATH, the caller's entries after it
    (an implementation under test found through them must be found by the ranks too)."""
    return child_env(ROOT, OMP_NUM_THREADS="1")


@pytest.mark.slow  # torchrun: a torch start-up per rank
@pytest.mark.parametrize("nproc", [2, 4])
def test_torchrun_gloo(tmp_path, impl, nproc):
    out = tmp_path / "report.json"
    argv = ["--standalone", f"--nproc-per-node={nproc}", "-m", "dcp_a2a", "accuracy",
            "--shapes", SMALL, "--dist-backend", "gloo", "--out", str(out), *CASE_ARGS[nproc]]
    proc = run_torchrun(argv, env=_rank_env(), cwd=ROOT, timeout=300, out_dir=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    args = accuracy.parse_args(CASE_ARGS[nproc])
    _check_report(report, nproc, SMALL, 3 if impl.is_project else 1, dtypes=args.dtype,
                  bases={"e": ("e",), "2": ("2",), "both": ("e", "2")}[args.base])
    assert report["meta"]["dist_backend"] == "gloo"
    assert report["meta"]["implementation"] == impl.spec
    if impl.is_project:  # "all" leaves out what gloo cannot run, and says why
        assert "needs an NCCL group" in report["meta"]["backends_not_run"]["symm_mem"]
        assert "not run: symm_mem" in proc.stdout
    # rank 0 printed the table: one line per case, and the summary
    assert f"dcp_a2a accuracy: N={nproc} gloo" in proc.stdout
    assert f"{len(report['cases'])} cases, 0 failed" in proc.stdout
    print(proc.stdout)


PLACED = "from dcp_a2a.reference.contract import lse_pack_dim, pack_send, unpack_combine, " \
         "lse_reduce\n"


@pytest.mark.slow  # torchrun: a torch start-up per rank
@pytest.mark.parametrize("where", ["PYTHONPATH", "working directory"])
def test_a_correct_implementation_passes_wherever_it_is_imported_from(tmp_path, monkeypatch,
                                                                      where):
    """A correct implementation (the reference contract's functions, in a module of its own)
    that the caller reaches only through its PYTHONPATH, or only through its working directory
    (which the implementation loader puts on PYTHONPATH, as validate's session has it): the
    job's torchrun ranks import it too. This test's ranks once got PYTHONPATH=<checkout> in
    place of the caller's: "cannot import implementation module" on every rank, a correct
    implementation failed by where it lived."""
    from dcp_a2a.testing.impl import load_impl

    home = tmp_path / "somewhere"
    home.mkdir()
    (home / "placed_impl.py").write_text(PLACED)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("DCP_A2A_IMPL", raising=False)
    if where == "PYTHONPATH":
        monkeypatch.setenv("PYTHONPATH", str(home))
    else:
        monkeypatch.chdir(home)
        monkeypatch.setattr("sys.path", list(__import__("sys").path))
        load_impl("placed_impl")  # what validate and the suite's plugin do with --impl
    out = tmp_path / "report.json"
    argv = ["--standalone", "--nproc-per-node=2", "-m", "dcp_a2a", "accuracy", "--impl",
            "placed_impl", "--shapes", "1x2x8", "--dtype", "float32", "--base", "e",
            "--dist-backend", "gloo", "--out", str(out), "--quiet"]
    proc = run_torchrun(argv, env=_rank_env(), cwd=ROOT, timeout=300, out_dir=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["meta"]["implementation"] == "placed_impl"
    assert [c["ok"] for c in report["cases"]] == [True]


def test_in_process_on_three_ranks(rank_pool, impl):
    argv = ["--shapes", "5x6x40", "--dtype", "float16", "--quiet"]
    results = rank_pool.run(mp_tasks.accuracy_job, 3, argv, n=3, timeout=120)
    report, status = results[0]
    assert status == 0
    assert all(r == (None, 0) for r in results[1:])
    _check_report(report, 3, "5x6x40", 3 if impl.is_project else 1, dtypes=("float16",))
    table = accuracy_report.format_table(report)
    assert f"{len(report['cases'])} cases, 0 failed" in table


def test_broken_implementation_fails_the_job(rank_pool):
    """An implementation that rounds the merged LSE through bfloat16 and scales the output by
    (1 + 2^-7) must be flagged: failing rows and exit status 1."""
    argv = ["--shapes", "2x4x24", "--dtype", "bfloat16,float32", "--base", "e", "--quiet",
            "--impl", "dcp_a2a.testing.tasks:BROKEN"]
    results = rank_pool.run(mp_tasks.accuracy_job, 2, argv, n=2, timeout=120)
    report, status = results[0]
    assert status == 1
    assert report["ok"] is False
    assert report["meta"]["implementation"] == "dcp_a2a.testing.tasks:BROKEN"
    assert [c["backend"] for c in report["cases"]] == ["default", "default"]
    for c in report["cases"]:
        assert not c["ok"]
        assert c["output"]["failures"] > 0 and c["lse"]["failures"] > 0
    assert "FAIL" in accuracy_report.format_table(report)


@pytest.mark.parametrize("mutant", ["empty_shard_mask_ignored", "bf16_lse_bits_read_as_fp32"])
def test_the_job_fails_the_engine_bug_classes(rank_pool, mutant):
    """Two classes of bug engines shipped, which random partials alone never show: a pack that
    ignores seq_lens (empty KV shards merged in) and one that reads a 16-bit LSE's bits as
    float32's. The job's batches hold empty shards and hand 16-bit LSEs over, so it fails
    both (before, 18 of 18 cases passed each)."""
    argv = ["--shapes", "5x4x24", "--dtype", "bfloat16", "--quiet",
            "--impl", f"dcp_a2a.testing.mutants.{mutant}"]
    results = rank_pool.run(mp_tasks.accuracy_job, 2, argv, n=2, timeout=120)
    report, status = results[0]
    assert status == 1 and report["ok"] is False
    assert any(not c["ok"] for c in report["cases"])


def test_case_layout():
    """Below B = 3 every row merges every rank; from 3 on, a padding row masked on every rank,
    at least one empty shard, most rows unmasked, the same on every rank."""
    for b in (0, 1, 2):
        qsl, seq_lens, masked = accuracy_cases.case_layout(b, 4, case=3)
        assert qsl == list(range(b + 1)) and not any(map(any, masked))
    for b, world, case in [(3, 2, 1), (16, 2, 7), (128, 8, 5)]:
        qsl, seq_lens, masked = accuracy_cases.case_layout(b, world, case)
        assert qsl[-1] == b - 1 and qsl[1] == 2 and len(seq_lens) == world
        assert all(m[-1] for m in masked)
        empty_shard_rows = sum(map(sum, masked)) - world  # less the padding row
        assert empty_shard_rows >= 1
        if b >= 16:  # most rows merge every rank
            assert empty_shard_rows <= (b - 1) * world // 4, empty_shard_rows
        assert (qsl, seq_lens, masked) == accuracy_cases.case_layout(b, world, case)


def test_shape_arguments():
    assert accuracy_cases.parse_shapes("1x128x512, 8192x64x512:bfloat16") == [
        accuracy_cases.Shape(1, 128, 512), accuracy_cases.Shape(8192, 64, 512, "bfloat16")]
    for bad in ("1x128", "ax2x3", "1x0x4", "1x2x3:float8", "", "1x2x3,1x2x3", "1x2x3,"):
        with pytest.raises(ValueError):
            accuracy_cases.parse_shapes(bad)
    with pytest.raises(ValueError, match="not divisible by the world size 3"):
        accuracy_cases.resolve_shapes("2x8x24", 3, gpu=False)
    # the default sweep leaves out what the world size cannot split, and says so
    shapes, skipped = accuracy_cases.resolve_shapes(None, 3, gpu=False)
    assert skipped == ["1x128x512"] and all(s.h % 3 == 0 for s in shapes)
    gpu, _ = accuracy_cases.resolve_shapes(None, 8, gpu=True)
    assert {str(s) for s in gpu} >= {"1x128x512", "16x128x512", "128x128x512", "8192x64x512"}
    # a head dim that is not a power of two, on GPUs too (every other default is 512)
    assert any(s.d & (s.d - 1) for s in gpu) and any(s.d & (s.d - 1) for s in shapes)
    with pytest.raises(SystemExit):
        accuracy.parse_args(["--backend", "nope"])
    assert accuracy.parse_args(["--backend", "packed,ag_rs"]).backend == ["packed", "ag_rs"]
    assert accuracy.parse_args([]).dtype == list(accuracy.DTYPES)
