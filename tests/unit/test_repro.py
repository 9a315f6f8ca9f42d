"""A failing test's calls as a few lines of Python (dcp_a2a.testing.repro): the script it renders
repeats the calls with the same values, dtypes and strides."""

from __future__ import annotations

import sys

import pytest
import torch

from dcp_a2a.testing import repro

pytestmark = pytest.mark.unit

STUB = '''
CALLS = []

def pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim, seq_lens=None,
              query_start_loc=None):
    CALLS.append((out.clone(), lse.clone(), tuple(seq_lens.stride()), seq_lens.tolist(),
                  query_start_loc.tolist(), world_size, head_dim))
'''


def test_a_rendered_reproducer_repeats_the_call(tmp_path, monkeypatch):
    (tmp_path / "stub_engine.py").write_text(STUB)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = torch.randn(3, 4, 2).to(torch.bfloat16)
    lse = torch.tensor([[1.5, -float("inf"), float("nan"), 3.25]] * 3)
    table = torch.tensor([[7, 0, 1], [7, 4, 1], [7, 0, 1]], dtype=torch.int32)
    seq_lens = table[:, 1]  # a strided view, as an engine slices its table
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    send = torch.empty(2, 3, 2, 4, dtype=torch.bfloat16)
    repro.clear()
    repro.record("pack_send", (out, lse, send, 2, 2, 2, 2),
                 {"seq_lens": seq_lens, "query_start_loc": qsl})
    script = repro.render(repro.calls(), "stub_engine", "12 of 72 wire words differ")
    assert "as_strided([3], [3])" in script and "12 of 72 wire words differ" in script
    import importlib

    ns = {}
    import dcp_a2a.testing.impl as impl_mod

    monkeypatch.setattr(impl_mod, "load_impl", lambda spec: importlib.import_module(spec))
    exec(compile(script, "repro", "exec"), ns)
    got = sys.modules["stub_engine"].CALLS[-1]
    assert torch.equal(got[0].view(torch.int16), out.view(torch.int16))
    assert torch.equal(got[1], lse) is False  # NaN != NaN: compare bits instead
    assert torch.equal(got[1].view(torch.int32), lse.view(torch.int32))
    assert got[2] == (3,) and got[3] == [0, 4, 0] and got[4] == [0, 1, 2, 3]
    assert got[5:] == (2, 2)


def test_big_and_captured_tensors_keep_only_their_description():
    repro.clear()
    big = torch.zeros(repro.MAX_VALUES + 1)
    repro.record("merge", (big,), {})
    script = repro.render(repro.calls(), "x", "boom")
    assert "values not kept" in script and str(repro.MAX_VALUES + 1) in script


def test_only_the_last_calls_are_kept():
    repro.clear()
    for i in range(repro.KEEP + 3):
        repro.record("lse_pack_dim", (torch.float16,), {"i": i})
    kept = repro.calls()
    assert len(kept) == repro.KEEP and kept[-1].kwargs["i"] == repro.KEEP + 2
