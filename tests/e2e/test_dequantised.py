"""evals.dequantised: a prepared model's copy in float32 safetensors, written, checked and
stamped, and what resolve_model loads while the stamp matches. A tiny saved model stands in
for the GGUF-loaded one (transformers' GGUF reading is not what is tested; the 1.5B's copy was
checked bit for bit in float32 and bfloat16 on the real file, docs/evals.md)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from dcp_a2a.evals import dequantised as dq
from dcp_a2a.evals import model as em
from dcp_a2a.evals import prepare, registry

pytestmark = pytest.mark.unit


@pytest.fixture
def tiny_model_dir(tiny_dir):
    return tiny_dir[0]


@pytest.fixture
def fake(tmp_path, monkeypatch, tiny_model_dir):
    """A registered model "fake" prepared in a temporary cache, whose loading (from its GGUF
    path) gives the tiny saved model."""
    data = b"GGUF" * 250
    spec = em.ModelSpec(name="fake", title="fake model", gguf_name="fake.gguf",
                        wheels=("fake-wheel==1.0",), packages=("fake_wheel_pkg",),
                        member="*.gguf", size=len(data), sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(em.MODELS, "fake", spec)
    monkeypatch.setattr(registry, "installed_pieces", lambda spec: None)
    # resolve_model refuses a GGUF without the gguf package (CI has none); none is read here
    find_spec = em.importlib.util.find_spec
    monkeypatch.setattr(em.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "gguf" else find_spec(name, *a))
    cache = tmp_path / "cache"
    monkeypatch.setenv(em.CACHE_ENV, str(cache))
    gguf = em.cached_path(spec, cache)
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(data)
    em.stamp_path(gguf).write_text(f"{spec.sha256} {spec.size}\n")
    real_load = em.load_model
    asked = []

    def load_from_gguf(pretrained=None, gguf_file=None, dtype="float32", device="cpu",
                       model=None):
        asked.append((pretrained, gguf_file, dtype))
        if gguf_file == spec.gguf_name:
            return real_load(str(tiny_model_dir), None, dtype=dtype, device=device)
        return real_load(pretrained, gguf_file, dtype=dtype, device=device, model=model)

    monkeypatch.setattr(em, "load_model", load_from_gguf)
    return spec, cache, gguf, asked


def _logits(m, tok):
    enc = tok(["Question: Tom has 3 apples and buys 4 more. How many?"], return_tensors="pt")
    with torch.no_grad():
        return m(**enc).logits


def test_export_then_resolve_loads_the_same_model(fake, tiny_model_dir):
    spec, cache, gguf, asked = fake
    assert dq.find(spec) is None
    assert em.resolve_model("fake")["gguf_file"] == "fake.gguf"
    d = dq.export(spec, em.load_model, log=lambda _: None)
    assert asked == [(str(gguf.parent), "fake.gguf", "float32")]  # read from the GGUF
    assert d == dq.path(spec, cache) and dq.find(spec) == d
    assert not d.with_name(d.name + ".tmp").exists()
    assert {"model.safetensors", "config.json", dq.STAMP} <= {p.name for p in d.iterdir()}
    r = em.resolve_model("fake")
    assert r == {"pretrained": str(d), "gguf_file": None, "model": "fake"}
    for dtype in ("float32", "bfloat16"):
        src, stok = em.load_model(str(tiny_model_dir), None, dtype=dtype)
        got, gtok = em.load_model(r["pretrained"], r["gguf_file"], dtype=dtype)
        assert torch.equal(_logits(src, stok), _logits(got, gtok))
        assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(),
                                                      got.state_dict().values()))


def test_a_tied_model_is_written_once_and_tied_again(fake, tiny_model_dir, tmp_path,
                                                     monkeypatch):
    """Tied input and output embeddings (SmolLM2's GGUF) are one storage under two names,
    which safetensors refuses to write: the copy keeps one and the config ties them again."""
    from transformers import AutoModelForCausalLM

    spec, cache, gguf, _ = fake
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    m.config.tie_word_embeddings = True
    m.lm_head.weight = m.get_input_embeddings().weight
    tied = tmp_path / "tied"
    m.save_pretrained(tied)
    for f in tiny_model_dir.iterdir():
        if "token" in f.name:
            (tied / f.name).write_bytes(f.read_bytes())
    load = em.load_model  # the fixture's: the "GGUF" is the tiny untied model
    monkeypatch.setattr(em, "load_model", lambda p=None, g=None, dtype="float32", **kw: load(
        str(tied), None, dtype=dtype) if g == spec.gguf_name else load(p, g, dtype=dtype, **kw))
    d = dq.export(spec, em.load_model, log=lambda _: None)
    got, _ = em.load_model(str(d), None)
    assert got.lm_head.weight.data_ptr() == got.get_input_embeddings().weight.data_ptr()
    assert torch.equal(got.lm_head.weight, m.lm_head.weight)


@pytest.mark.parametrize("field, value", [("gguf_sha256", "0" * 64), ("transformers", "0.0.1"),
                                          ("format", "something else")])
def test_a_stale_stamp_falls_back_to_the_gguf(fake, field, value):
    spec, cache, gguf, _ = fake
    d = dq.export(spec, em.load_model, log=lambda _: None)
    stamp = json.loads((d / dq.STAMP).read_text())
    (d / dq.STAMP).write_text(json.dumps({**stamp, field: value}))
    assert dq.find(spec) is None
    assert em.resolve_model("fake") == {"pretrained": str(gguf.parent), "gguf_file": "fake.gguf",
                                        "model": "fake"}


def test_a_copy_that_reads_back_differently_is_not_kept(fake, monkeypatch):
    spec, cache, gguf, _ = fake
    import safetensors.torch as st

    real_save = st.save_file

    def save_with_one_bit_off(tensors, filename, metadata=None):
        k = sorted(tensors)[0]
        bad = tensors[k].clone()
        bad.view(-1)[0] = torch.nextafter(bad.view(-1)[0], torch.tensor(float("inf")))
        real_save({**tensors, k: bad}, filename, metadata=metadata)

    monkeypatch.setattr(st, "save_file", save_with_one_bit_off)
    with pytest.raises(dq.DequantiseError, match=r"tensor .* differs; nothing kept"):
        dq.export(spec, em.load_model, log=lambda _: None)
    assert not dq.path(spec, cache).exists()
    assert not dq.path(spec, cache).with_name(dq.DIR_NAME + ".tmp").exists()
    assert em.resolve_model("fake")["gguf_file"] == "fake.gguf"


def test_prepare_dequantise_command(fake, capsys):
    spec, cache, gguf, _ = fake
    assert prepare.main(["--model", "fake", "--dequantise"]) == gguf
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == str(gguf) and "bitwise equal read back" in out[-2]
    assert dq.find(spec) is not None
    stamp = (dq.path(spec, cache) / dq.STAMP).stat().st_mtime_ns
    prepare.main(["--model", "fake", "--dequantise"])  # a valid copy is kept as it is
    assert "already dequantised" in capsys.readouterr().out
    assert (dq.path(spec, cache) / dq.STAMP).stat().st_mtime_ns == stamp
    with pytest.raises(SystemExit) as e:
        prepare.main(["--model", "fake", "--dequantise", "--split", str(cache / "p")])
    assert e.value.code == 2
    assert "does not go with --split" in capsys.readouterr().err
