"""``--impl vllm``: the shipped adapter maps the contract onto vLLM's own functions. Checked here
against a stand-in vLLM module with exactly vLLM's signatures (built on the reference contract),
at both module paths vLLM has used; without vLLM, ``--impl vllm`` is one usage error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dcp_a2a.testing.impl import load_impl

pytestmark = pytest.mark.unit

STANDIN = '''
"""Stand-in for vLLM's DCP all-to-all ops: vLLM's names and signatures, the reference math."""
from dcp_a2a.reference import contract as _c

CALLS = []


def _dcp_a2a_lse_pack_dim(output_dtype):
    return _c.lse_pack_dim(output_dtype)


def _dcp_a2a_pack_send(cp_attn_out, cp_attn_lse, send_buffer, world_size, h_per_rank, head_dim,
                       lse_pack_dim, seq_lens=None, query_start_loc=None):
    _c.pack_send(cp_attn_out, cp_attn_lse, send_buffer, world_size, h_per_rank, head_dim,
                 lse_pack_dim, seq_lens=seq_lens, query_start_loc=query_start_loc)


def _dcp_a2a_unpack_combine(recv_buffer, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
    return _c.unpack_combine(recv_buffer, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)


def dcp_a2a_lse_reduce(cp_attn_out, cp_attn_lse, cp_group, ctx=None, return_lse=False,
                       is_lse_base_on_e=True, seq_lens=None, query_start_loc=None):
    assert ctx is None
    # what vLLM reads of its GroupCoordinator
    cp_group.world_size, cp_group.rank_in_group, cp_group.device_group, cp_group.rank
    return _c.lse_reduce(cp_attn_out, cp_attn_lse, cp_group, return_lse=return_lse,
                         is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
                         query_start_loc=query_start_loc)
'''


def _standin(root: Path, module: str) -> Path:
    """A package tree ``vllm/...`` under ``root`` with the stand-in at ``module``."""
    parts = module.split(".")
    d = root
    for p in parts[:-1]:
        d = d / p
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").touch()
    (d / f"{parts[-1]}.py").write_text(textwrap.dedent(STANDIN))
    return root


def _pytest(args, pythonpath: Path | None, cwd: Path):
    env = dict(os.environ)
    env.pop("DCP_A2A_IMPL", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-p", "dcp_a2a.testing.plugin",
                           "--pyargs", "dcp_a2a.testing.conformance", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_without_vllm_it_is_one_usage_error(tmp_path):
    if __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ValueError, match="vLLM is not installed"):
        load_impl("vllm")
    proc = _pytest(["--impl", "vllm", "--co", "-q"], None, tmp_path)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert any("vLLM is not installed" in line for line in err), proc.stderr
    assert "Traceback" not in proc.stderr


def _fresh_vllm(monkeypatch, root: Path):
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")
                 or m == "dcp_a2a.testing.adapters.vllm"]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.slow
def test_adapter_passes_the_contract_on_the_standin(tmp_path):
    """The conformance suite through ``--impl vllm`` from another directory: the wire format
    and bad input (lse_reduce's checks go through the adapter's GroupCoordinator)."""
    root = _standin(tmp_path / "site", "vllm.v1.attention.ops.dcp")
    work = tmp_path / "work"
    work.mkdir()
    proc = _pytest(["--impl", "vllm", "-m", "conformance", "-q", "-x",
                    "-k", "test_args or test_wire_format"], root, work)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout


def test_adapter_finds_the_older_module_path(tmp_path, monkeypatch):
    import torch

    from dcp_a2a.reference import contract

    _fresh_vllm(monkeypatch, _standin(tmp_path / "site", "vllm.v1.attention.ops.dcp_alltoall"))
    impl = load_impl("vllm")
    assert impl.obj.OPS.__name__ == "vllm.v1.attention.ops.dcp_alltoall"
    out, lse = torch.randn(2, 4, 6).to(torch.bfloat16), torch.randn(2, 4)
    got = torch.empty(2, 2, 2, 8, dtype=torch.bfloat16)
    want = torch.empty_like(got)
    impl.pack_send(out, lse, got, 2, 2, 6, impl.lse_pack_dim(torch.bfloat16))
    contract.pack_send(out, lse, want, 2, 2, 6, 2)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_adapter_refuses_a_vllm_without_the_functions(tmp_path, monkeypatch):
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").touch()
    _fresh_vllm(monkeypatch, root)
    with pytest.raises(ValueError, match="no DCP all-to-all functions"):
        load_impl("vllm")
