"""The engine adapters' plumbing (dcp_a2a/testing/adapters), on stand-ins that carry each
engine's module paths, names and signatures (tests/unit/engine_standins.py): both forms of
every engine (installed; its release read by name from a wheel, a tree or a source file), the
mapping of the contract's arguments onto the engine's, the one-line refusals, the release
cache, find_release, and the conformance suite run through the stand-ins."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from dcp_a2a.reference import contract
from dcp_a2a.reference.combine import lse_weighted_combine
from dcp_a2a.testing import adapters
from dcp_a2a.testing.adapters import _common, _release
from dcp_a2a.testing.impl import load_impl
from dcp_a2a.testing.surfaces import Unsupported

from . import engine_standins as standins

pytestmark = pytest.mark.unit

ENGINES = ("vllm", "sglang", "flashinfer")


class _One:
    """A DCP group of one, as an engine's coordinator: no process group behind it."""

    world_size, rank_in_group, device_group = 1, 0, None


def _engine_modules(names, *engines):
    return {m for m in names if m.split(".")[0] in (engines or ENGINES)}


@pytest.fixture(autouse=True)
def _own_cache_and_modules(tmp_path, monkeypatch):
    """Each test writes its releases under its own tmp_path and leaves no stand-in imported."""
    monkeypatch.setenv(_release.CACHE_ENV, str(tmp_path / "cache"))
    before = set(sys.modules)
    yield
    for name in _engine_modules(set(sys.modules) - before):
        del sys.modules[name]


def _installed(monkeypatch, root: Path, engine: str):
    """``engine``'s stand-in tree first on sys.path, no copy of it imported yet."""
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == engine or m.startswith(engine + ".")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    def make(engine, replace=None):
        root = standins.installed_tree(tmp_path / f"site-{engine}", engine, replace)
        _installed(monkeypatch, root, engine)
        return root
    return make


def _partials(n=2, b=3, h=4, d=8, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, b, h, d, generator=g).to(dtype),
            (torch.randn(n, b, h, generator=g) * 3).to(torch.float32))


def _packed_roundtrip(impl, dtype=torch.bfloat16):
    """pack_send through the adapter against the reference's, and its merge."""
    n, b, h, d = 2, 3, 4, 8
    outs, lses = _partials(1, b, h, d, dtype)
    p = impl.lse_pack_dim(dtype)
    got = torch.full((n, b, h // n, d + p), float("nan"), dtype=dtype)
    want = torch.empty_like(got)
    impl.pack_send(outs[0], lses[0], got, n, h // n, d, p)
    contract.pack_send(outs[0], lses[0], want, n, h // n, d, p)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    out, lse = impl.unpack_combine(got, d, p, True, True)
    ref_out, ref_lse = contract.unpack_combine(want, d, p, True, True)
    assert torch.equal(out.float(), ref_out.float()) and torch.equal(lse, ref_lse)


# --------------------------------------------------------------------------- both forms
@pytest.mark.parametrize("form", ["installed", "wheel", "tree", "file"])
def test_vllm_forms(form, tmp_path, installed):
    if form == "installed":
        installed("vllm")
        impl = load_impl("vllm")
    else:
        path = {"wheel": lambda: standins.wheel(tmp_path, "vllm"),
                "tree": lambda: standins.installed_tree(tmp_path / "tree", "vllm"),
                "file": lambda: standins.source_file(tmp_path, "vllm")}[form]()
        before = set(sys.modules)
        impl = load_impl(f"vllm={path}")
        # the release form ran none of the file's own imports (vLLM's internals)
        assert not _engine_modules(set(sys.modules) - before, "vllm")
        assert Path(impl.obj.OPS.__file__).is_relative_to(tmp_path / "cache")
    assert impl.surfaces == {"merge", "wire", "exchange", "masking", "caller buffer",
                             "up-projection"}
    assert impl.envelope.head_dims == "power of two"
    where = {"installed": "(installed at ", "wheel": "0.34.0 (wheel ", "tree": "(directory ",
             "file": "(file "}[form]
    assert impl.engine.startswith("vLLM ") and where in impl.engine
    _packed_roundtrip(impl)


@pytest.mark.parametrize("form", ["installed", "wheel", "file"])
def test_sglang_forms(form, tmp_path, installed):
    if form == "installed":
        installed("sglang")
        impl = load_impl("sglang")
    else:
        if form == "wheel":
            path = standins.wheel(tmp_path, "sglang")
        else:  # comm.py inside an unpacked tree: dcp_kernels.py is read from the tree
            root = standins.installed_tree(tmp_path / "tree", "sglang")
            path = root / "sglang/srt/layers/dcp/comm.py"
        before = set(sys.modules)
        impl = load_impl(f"sglang={path}")
        assert not _engine_modules(set(sys.modules) - before, "sglang")
    assert impl.surfaces == {"merge", "wire", "exchange"}
    assert impl.envelope.lse_dtypes == ("float32",)
    _packed_roundtrip(impl)
    outs, lses = _partials()
    out, lse = impl.merge(outs, lses, is_lse_base_on_e=False, return_lse=True)
    ref_out, ref_lse = lse_weighted_combine(outs, lses, True, False)
    assert torch.equal(out, ref_out.to(out.dtype)) and torch.equal(lse, ref_lse.float())
    assert impl.merge(outs, lses).shape == (3, 4, 8)


def test_vllm_release_masking_with_its_own_helper(tmp_path):
    """vLLM 0.29.0 masks with a helper of another name (``mask_dcp_empty_shards_``): read
    where defined; a helper that is neither read nor defined refuses the release in one line
    naming it, instead of a NameError in every masked test."""
    older = standins.wheel(tmp_path, "vllm", {
        **standins.VLLM_EARLIER, "_validate_dcp_empty_shard_args": "mask_dcp_empty_shards_"})
    impl = load_impl(f"vllm={older}")
    assert impl.surfaces == {"merge", "wire", "exchange", "masking"}
    _packed_roundtrip(impl)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    helper = standins.wheel(unknown, "vllm", {"_validate_dcp_empty_shard_args": "_check_masks"})
    with pytest.raises(ValueError, match=r"_dcp_a2a_pack_send uses _check_masks, which its "
                                         r"vllm/v1/attention/ops/dcp\.py does not define") as e:
        load_impl(f"vllm={helper}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("form", ["installed", "wheel"])
def test_sglang_earlier_release_without_its_pack(form, tmp_path, installed):
    """SGLang 0.5.17 (a merge and an exchange, no pack kernel): the adapter loads it and
    judges the merge and the exchange; the wire format is not applicable."""
    if form == "installed":
        installed("sglang", replace=standins.SGLANG_EARLIER)
        impl = load_impl("sglang")
    else:
        impl = load_impl(f"sglang={standins.wheel(tmp_path, 'sglang', standins.SGLANG_EARLIER)}")
    assert impl.surfaces == {"merge", "exchange"}
    assert impl.engine.endswith("this release has no dcp_pack_a2a_send")
    outs, lses = _partials()
    out = impl.merge(outs, lses)
    assert torch.equal(out, lse_weighted_combine(outs, lses, False, True).to(out.dtype))
    assert not impl.has("pack_send")  # merges go through its merge, not a pack it lacks
    p = impl.lse_pack_dim(outs.dtype)
    recv = torch.empty(2, 3, 2, 8 + p, dtype=outs.dtype)
    contract.pack_send(outs[0], lses[0], recv, 2, 2, 8, p)
    got, got_lse = impl.unpack_combine(recv, 8, p, True, True)
    want, want_lse = contract.unpack_combine(recv, 8, p, True, True)
    assert torch.equal(got.float(), want.float()) and torch.equal(got_lse, want_lse)
    assert impl.envelope.lse_dtypes == ("float32", "bfloat16", "float16")  # the pack's limit
    # a required name still refuses the release, in one line
    lacking = standins.wheel(tmp_path, "sglang", {"def dcp_lse_combine_triton(": "def _gone("})
    with pytest.raises(ValueError, match=r"dcp_kernels\.py defines no dcp_lse_combine_triton$"):
        load_impl(f"sglang={lacking}")


@pytest.mark.parametrize("form", ["installed", "wheel", "file"])
@pytest.mark.parametrize("variant", [None, "merge_state"])
def test_flashinfer_forms(form, variant, tmp_path, installed, monkeypatch):
    monkeypatch.setattr(_common, "cuda_gpus", lambda: 0)
    if form == "installed":
        installed("flashinfer")
        spec = "flashinfer"
    else:
        path = (standins.wheel(tmp_path, "flashinfer") if form == "wheel"
                else standins.source_file(tmp_path, "flashinfer"))
        spec = f"flashinfer={path}"
    if variant:
        spec = spec.replace("flashinfer", f"flashinfer:{variant}", 1)
    impl = load_impl(spec)
    assert impl.surfaces == {"merge"} and impl.envelope.bases == ("2",)
    assert "Triton cascade kernels" in impl.engine
    outs, lses = _partials(n=3)
    out, lse = impl.merge(outs, lses, is_lse_base_on_e=False, return_lse=True)
    if variant is None:  # one merge of the three partials
        ref_out, ref_lse = lse_weighted_combine(outs, lses, True, False)
        assert torch.equal(out, ref_out.to(out.dtype)) and torch.equal(lse, ref_lse.float())
    else:  # ((0, 1), 2): each intermediate rounded to the output dtype, as a caller's chain
        first, g = lse_weighted_combine(outs[:2], lses[:2], True, False)
        ref_out, ref_lse = lse_weighted_combine(
            torch.stack([first.to(outs.dtype), outs[2]]), torch.stack([g.float(), lses[2]]),
            True, False)
        assert torch.equal(out, ref_out.to(out.dtype)) and torch.equal(lse, ref_lse.float())
    with pytest.raises(Unsupported, match="base-e LSEs"):
        impl.merge(outs, lses, is_lse_base_on_e=True)


def test_flashinfer_launch_keeps_its_wrappers_checks(tmp_path, monkeypatch):
    """FlashInfer's host wrappers refuse non-contiguous states: the adapter's launch too."""
    monkeypatch.setattr(_common, "cuda_gpus", lambda: 0)
    impl = load_impl(f"flashinfer:merge_state={standins.wheel(tmp_path, 'flashinfer')}")
    outs, lses = _partials(n=2, b=3, h=4, d=8)
    with pytest.raises(ValueError, match="must be contiguous"):
        impl.merge(outs.transpose(1, 2), lses.transpose(1, 2), is_lse_base_on_e=False)
    with pytest.raises(Unsupported, match="2 or more"):
        impl.merge(outs[:1], lses[:1], is_lse_base_on_e=False)


# --------------------------------------------------------------------------- the mapping
def test_vllm_maps_into_the_up_projection_and_the_group_of_one(tmp_path):
    impl = load_impl(f"vllm={standins.wheel(tmp_path, 'vllm')}")
    outs, lses = _partials(2, 3, 4, 8)
    p = impl.lse_pack_dim(outs.dtype)
    recv = torch.empty(2, 3, 2, 8 + p, dtype=outs.dtype)
    contract.pack_send(outs[0], lses[0], recv, 2, 2, 8, p)
    into = torch.full((3, 2, 8), float("nan"), dtype=outs.dtype)
    got = impl.unpack_combine(recv, 8, p, False, True, into=into)
    assert got is into and torch.equal(into, contract.unpack_combine(recv, 8, p, False, True))

    # a group of one: vLLM's shortcut hands back the input itself, and the LSE with it
    out, lse = outs[0], lses[0]
    assert impl.lse_reduce(out, lse, _One()) is out
    got_out, got_lse = impl.lse_reduce(out, lse, _One(), return_lse=True)
    assert got_out is out and got_lse is lse

    # the up-projection: [B, H, L] latent, W [H, L, V] -> [B, H/N, V]
    w = torch.randn(4, 8, 6).to(outs.dtype)
    want = torch.einsum("bhl,hlv->bhv", out.double(), w.double()).to(outs.dtype)
    got = impl.lse_reduce(out, lse, _One(), w_uv=w)
    assert got.shape == (3, 4, 6) and torch.equal(got, want)
    into = torch.full((3, 4, 6), float("nan"), dtype=outs.dtype)
    assert impl.lse_reduce(out, lse, _One(), w_uv=w, into=into) is into
    assert torch.equal(into, want)
    rows = torch.empty(3, 6, 4, dtype=outs.dtype).transpose(1, 2)  # heads and lanes swapped
    with pytest.raises(Unsupported, match="cannot be viewed as one row"):
        impl.lse_reduce(out, lse, _One(), w_uv=w, into=rows)
    with pytest.raises(Unsupported, match="returns none"):
        impl.lse_reduce(out, lse, _One(), w_uv=w, return_lse=True)


def test_sglang_says_what_its_api_cannot_express(tmp_path):
    impl = load_impl(f"sglang={standins.wheel(tmp_path, 'sglang')}")
    outs, lses = _partials(1, 3, 4, 8)
    out, lse = outs[0], lses[0]
    assert impl.lse_reduce(out, lse, _One()) is out  # SGLang's shortcut, visible
    with pytest.raises(Unsupported, match="returns none"):
        impl.lse_reduce(out, lse, _One(), return_lse=True)
    send = torch.empty(2, 3, 2, 10, dtype=out.dtype)
    with pytest.raises(Unsupported, match="reads both off its buffers"):
        impl.pack_send(out, lse, send, 4, 1, 8, 2)
    with pytest.raises(Unsupported, match="two views of the row"):
        impl.pack_send(out, lse, send, 2, 2, 8, 1)
    with pytest.raises(ValueError, match="float32"):  # the engine's own refusal, untouched
        impl.pack_send(out, lse.bfloat16(), send, 2, 2, 8, 2)
    impl.pack_send(out, lse, send, 2, 2, 8, 2, seq_lens=None, query_start_loc=None)
    with pytest.raises(Unsupported, match="takes no masks"):
        impl.pack_send(out, lse, send, 2, 2, 8, 2, seq_lens=torch.tensor([1, 1, 1]),
                       query_start_loc=torch.tensor([0, 1, 2, 3]))
    mha = load_impl(f"sglang:ag_rs_mha={standins.wheel(tmp_path, 'sglang')}")
    assert mha.surfaces == {"exchange"} and mha.envelope.bases == ("e",)
    with pytest.raises(Unsupported, match="base-2"):
        mha.lse_reduce(out, lse, _One(), is_lse_base_on_e=False)
    mla = load_impl(f"sglang:ag_rs_mla={standins.wheel(tmp_path, 'sglang')}")
    assert mla.lse_reduce(out, lse, _One()) is out


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("engine,spec,message", [
    ("vllm", "vllm:nope", "vllm has no variant 'nope' (variants: a2a, ag_rs, direct)"),
    ("sglang", "sglang:nope", "sglang has no variant 'nope'"),
    ("flashinfer", "flashinfer:nope", "flashinfer has no variant 'nope'"),
    ("vllm", "vllm:direct", "vllm:direct needs 2 or more CUDA GPUs with NCCL"),
    ("sglang", "sglang:fi_a2a", "sglang:fi_a2a needs 2 or more CUDA GPUs"),
    ("flashinfer", "flashinfer:a2a", "flashinfer:a2a needs 2 or more CUDA GPUs"),
    ("vllm", "vllm:ag_rs=WHEEL", "vllm:ag_rs has no release form"),
    ("vllm", "vllm:direct=WHEEL", "vllm:direct has no release form"),
    ("sglang", "sglang:fi_a2a=WHEEL", "sglang:fi_a2a has no release form"),
    ("flashinfer", "flashinfer:a2a=WHEEL", "flashinfer:a2a has no release form"),
    ("vllm", "vllm=MISSING", "no such file or directory"),
    ("vllm", "vllm=TEXTFILE", "neither a wheel, a directory nor a .py source file"),
])
def test_one_line_refusals(engine, spec, message, tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "cuda_gpus", lambda: 0)
    other = tmp_path / "notes.txt"
    other.write_text("not an engine")
    spec = (spec.replace("WHEEL", str(standins.wheel(tmp_path, engine)))
            .replace("MISSING", str(tmp_path / "absent.whl")).replace("TEXTFILE", str(other)))
    with pytest.raises(ValueError) as e:
        load_impl(spec)
    text = str(e.value)
    assert message in text and "\n" not in text


def test_release_names_what_is_missing(tmp_path, monkeypatch):
    wheel = standins.wheel(tmp_path, "vllm", drop=("vllm/v1/attention/ops/dcp.py",))
    with pytest.raises(ValueError, match=r"^--impl vllm=.*: vllm-0\.34\.0-py3-none-any\.whl has "
                                         r"no vllm/v1/attention/ops/dcp\.py$"):
        load_impl(f"vllm={wheel}")
    lacking = standins.source_file(tmp_path, "vllm", replace={
        "def _dcp_a2a_pack_send(": "def _renamed(", "def dcp_a2a_lse_reduce(": "def _other("})
    with pytest.raises(ValueError, match=r"dcp\.py defines no _dcp_a2a_pack_send, "
                                         r"dcp_a2a_lse_reduce$"):
        load_impl(f"vllm={lacking}")
    alone = tmp_path / "alone"
    alone.mkdir()
    comm = standins.source_file(alone, "sglang", "sglang/srt/layers/dcp/comm.py")
    with pytest.raises(ValueError, match="is one file; sglang/kernels/ops/attention/"
                                         "dcp_kernels.py is needed too"):
        load_impl(f"sglang={comm}")
    with pytest.raises(ValueError, match=r"vtree has no sglang/kernels/ops/attention/"
                                         r"dcp_kernels\.py$"):
        load_impl(f"sglang={standins.installed_tree(tmp_path / 'vtree', 'vllm')}")


def test_installed_form_says_what_is_missing(tmp_path, installed, monkeypatch):
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ValueError, match="vLLM is not installed in this environment "
                                             r"\(install it, or pass its release"):
            load_impl("vllm")
    installed("vllm", replace={"def dcp_a2a_lse_reduce(": "def _older("})
    with pytest.raises(ValueError, match="dcp defines no dcp_a2a_lse_reduce "
                                         r"\(the adapter follows vLLM 0\.34\.0\)"):
        load_impl("vllm")


@pytest.mark.parametrize("form", ["installed", "wheel"])
def test_vllm_earlier_release_leaves_out_what_it_lacks(form, tmp_path, installed):
    """vLLM 0.30.0-0.33.0 (no out=, no up-projection op): the adapter loads it, exposes the
    surfaces it has, names what it lacks, and says "not applicable" where a test asks for the
    rest, instead of refusing the release or passing arguments it does not take."""
    if form == "installed":
        installed("vllm", replace=standins.VLLM_EARLIER)
        impl = load_impl("vllm")
    else:
        impl = load_impl(f"vllm={standins.wheel(tmp_path, 'vllm', standins.VLLM_EARLIER)}")
    assert impl.surfaces == {"merge", "wire", "exchange", "masking"}
    assert impl.engine.endswith("this release has no out=, no dcp_a2a_v_up_proj_lse_reduce")
    _packed_roundtrip(impl)
    outs, lses = _partials(2, 3, 4, 8)
    out, lse = outs[0], lses[0]
    with pytest.raises(Unsupported, match="take no out="):
        impl.lse_reduce(out, lse, _One(), into=torch.empty_like(out))
    with pytest.raises(Unsupported, match="defines no dcp_a2a_v_up_proj_lse_reduce"):
        impl.lse_reduce(out, lse, _One(), w_uv=torch.randn(4, 8, 6).to(out.dtype))
    assert impl.lse_reduce(out, lse, _One()) is out  # the release's own group-of-one shortcut


# --------------------------------------------------------------------------- the loader
def test_release_cache_is_keyed_by_the_text(tmp_path):
    wheel = standins.wheel(tmp_path, "vllm")
    names = [_release.Part("vllm/v1/attention/ops/dcp.py", ("_dcp_a2a_lse_pack_dim",))]
    a = _release.load(wheel, names, prelude="import torch\n", tag="t")
    assert _release.load(wheel, names, prelude="import torch\n", tag="t") is a
    (tmp_path / "other").mkdir()
    other = standins.wheel(tmp_path / "other", "vllm", replace={
        "contract.lse_pack_dim(output_dtype)": "contract.lse_pack_dim(output_dtype) + 0"})
    b = _release.load(other, names, prelude="import torch\n", tag="t")
    assert a.__file__ != b.__file__ and Path(a.__file__).parent != Path(b.__file__).parent
    # another process loads the very same file
    code = ("import sys; from pathlib import Path; from dcp_a2a.testing.adapters import "
            "_release as r; print(r.load(sys.argv[1], [r.Part('vllm/v1/attention/ops/dcp.py', "
            "('_dcp_a2a_lse_pack_dim',))], prelude='import torch\\n', tag='t').__file__)")
    proc = subprocess.run([sys.executable, "-c", code, str(wheel)], capture_output=True,
                          text=True, env=os.environ | {_release.CACHE_ENV: str(tmp_path / "cache")},
                          timeout=120)
    assert proc.stdout.strip() == a.__file__, proc.stderr[-2000:]


def test_definitions_reads_functions_classes_and_assignments():
    text = ("import os\n\n@dec\ndef f(x):\n    return x\n\nclass C:\n    pass\n\nN = 8\n"
            "M: int = 2\n\ndef g():\n    pass\n")
    found = _release.definitions(text, ("f", "C", "N", "M"), "x.py")
    assert found["f"].startswith("@dec\ndef f") and found["N"] == "N = 8\n"
    assert found["M"] == "M: int = 2\n" and found["C"].startswith("class C")
    with pytest.raises(ValueError, match="^x.py defines no h, os$"):
        _release.definitions(text, ("f", "h", "os"), "x.py")


def test_find_release(tmp_path):
    assert adapters.find_release("vllm", tmp_path) is None
    for name in ("vllm-0.33.1-cp38-abi3-manylinux_2_28_x86_64.whl",
                 "vllm-0.35.0rc1-cp38-abi3-manylinux_2_28_x86_64.whl",
                 "flashinfer_python-0.7.2-py3-none-any.whl",
                 "flashinfer_python-0.7.10-py3-none-any.whl", "sglang_router-0.5.23-x.whl"):
        (tmp_path / name).touch()
    assert adapters.find_release("vllm", tmp_path).name.startswith("vllm-0.35.0rc1")
    (tmp_path / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl").touch()
    assert adapters.find_release("vllm", tmp_path).name.startswith("vllm-0.34.0-")
    assert adapters.find_release("flashinfer", tmp_path).name == \
        "flashinfer_python-0.7.10-py3-none-any.whl"
    assert adapters.find_release("sglang", tmp_path) is None
    with pytest.raises(ValueError, match="no adapter for engine 'trtllm'"):
        adapters.find_release("trtllm", tmp_path)


def test_variants_table_is_the_adapters():
    rows = adapters.engine_variants()
    assert {(e, v) for e, v, *_ in rows if _[0]} == {("vllm", "a2a"), ("sglang", "a2a"),
                                                    ("flashinfer", "cascade")}
    for engine in ENGINES:
        mod = importlib.import_module(f"dcp_a2a.testing.adapters.{engine}")
        assert mod.VARIANTS is adapters.ENGINE_VARIANTS[engine]
    assert {(e, v) for e, v, _, gpus, _ in rows if gpus >= 2} == set(adapters.GPUS_NEEDED)


# --------------------------------------------------------------------------- end to end
def _conformance(spec: str, select: str, cwd: Path, pythonpath: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k != "DCP_A2A_IMPL"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                           "no:xdist", "-p", "dcp_a2a.testing.plugin", "--pyargs",
                           "dcp_a2a.testing.conformance", "--impl", spec, "-m", "conformance",
                           "-q", "-k", select, "-rs"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("engine,form,select", [
    ("vllm", "wheel", "test_send_buffer_matches_spec or test_masked_rows_go_out_as_minus_inf"),
    ("sglang", "file", "test_send_buffer_matches_spec or test_merge_within_bound_at_volume"),
])
def test_conformance_through_the_standins(engine, form, select, tmp_path):
    """The suite, through the adapter, judges the stand-in (whose numbers are the reference's):
    the selected clauses pass, and what the engine's API cannot express skips as not
    applicable."""
    work = tmp_path / "work"
    work.mkdir()
    path = None
    if form == "installed":
        path = standins.installed_tree(tmp_path / "site", engine)
        spec = engine
    elif form == "wheel":
        spec = f"{engine}={standins.wheel(tmp_path, engine)}"
    else:
        root = standins.installed_tree(tmp_path / "tree", engine)
        spec = f"{engine}={next(root.rglob('comm.py'))}"
    proc = _conformance(spec, select, work, path)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0 and " passed" in proc.stdout, tail
    assert " failed" not in proc.stdout and " error" not in proc.stdout, tail


DEFECTIVE_PACK = {
    # the kernel's two defects, in the stand-in: strided index tensors read as contiguous,
    # and an empty seq_lens dereferenced
    "    from dcp_a2a.reference import contract\n\n    contract.pack_send(":
        "    import os, signal\n    from dcp_a2a.reference import contract\n\n"
        "    if seq_lens is not None and seq_lens.numel() == 0:\n"
        "        os.kill(os.getpid(), signal.SIGSEGV)\n"
        "    if seq_lens is not None:\n"
        "        seq_lens = torch.as_strided(seq_lens, seq_lens.shape, (1,))\n"
        "        query_start_loc = torch.as_strided(query_start_loc, query_start_loc.shape, (1,))\n"
        "    contract.pack_send(",
}


def test_defect_probe_tells_a_correct_pack(tmp_path):
    from dcp_a2a.testing.adapters import vllm_defects

    spec = f"vllm={standins.wheel(tmp_path, 'vllm')}"
    for case in vllm_defects.CASES:
        v = vllm_defects.run_case(spec, case, "cpu")
        assert not v["defect"] and v["masked"] == v["expected_masked"], v


@pytest.mark.slow
def test_defect_probe_shows_both_defects(tmp_path, capsys):
    from dcp_a2a.testing.adapters import vllm_defects

    wheel = standins.wheel(tmp_path, "vllm", replace=DEFECTIVE_PACK)
    assert vllm_defects.main(["--impl", f"vllm={wheel}", "--device", "cpu"]) == 0
    empty, strided = capsys.readouterr().out.strip().splitlines()
    assert empty == "empty_seq_lens: DEFECT: the process died of SIGSEGV (signal 11)"
    assert strided.startswith("strided_index_tensors: DEFECT: rows masked [")
    assert "the reference masks [1, 2, 5, 6, 7]; " in strided


def test_adapters_hold_no_engine_code():
    """Nothing of the engines is kept in the package: no Triton kernel, no engine import."""
    here = Path(adapters.__file__).parent
    for file in here.glob("*.py"):
        text = file.read_text()
        assert "@triton.jit" not in text, file
        for engine in ("vllm", "sglang", "flashinfer"):
            assert f"\nimport {engine}" not in text and f"\nfrom {engine}" not in text, file
    assert not any(zipfile.is_zipfile(f) for f in here.iterdir() if f.is_file())
