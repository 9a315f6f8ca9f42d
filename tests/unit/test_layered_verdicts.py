"""The layered verdict end to end: a merge-only "engine" with a declared envelope, run through
conformance tests with the recorder. Its clauses without a surface are not applicable (never
failed, never passed), its declared limit is reported once, a case outside the envelope skips
as such, and its failures carry the right severity: weights from the fp32-rounded merged LSE
are weaker precision, a NaN let through a zero weight is a defect, a NaN LSE let in is a
difference of convention."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the conformance tests' device parameter

ENGINE = '''
"""A merge-only engine: power-of-two head dims, weights exp(s - fl(g)) in fp32 without a
zero-weight guard."""
import torch
from dcp_a2a.testing.surfaces import Envelope

ENVELOPE = Envelope(head_dims="power of two",
                    said={"head_dims": "RuntimeError: head dim must be a power of two"})


def merge(outs, lses, is_lse_base_on_e=True, return_lse=False):
    d = outs.shape[-1]
    if d & (d - 1):
        raise RuntimeError(f"head dim {d} must be a power of two")
    exp, log = (torch.exp, torch.log) if is_lse_base_on_e else (torch.exp2, torch.log2)
    s = lses.float()
    s = torch.where(torch.isnan(s) | (s == float("inf")), torch.full_like(s, -float("inf")), s)
    m = s.amax(0)
    m = torch.where(m == -float("inf"), torch.zeros_like(m), m)
    g = (log(exp(s - m).sum(0)) + m).float()                  # the merged LSE in fp32
    w = exp(s - g)                                            # weights from fl(g)
    out = (w[..., None] * outs.float()).sum(0)                # no guard: 0 * NaN = NaN
    return (out.to(outs.dtype), g) if return_lse else out.to(outs.dtype)
'''


def test_a_merge_only_engine_is_judged_by_layer(tmp_path):
    (tmp_path / "merge_engine.py").write_text(textwrap.dedent(ENGINE))
    prefix = tmp_path / "rec"
    files = [str(ROOT / "dcp_a2a/testing/conformance" / f) for f in (
        "test_merge.py", "test_envelope.py", "test_wire_format.py", "test_combine.py",
        "numerics/test_bound.py")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "dcp_a2a.testing.recorder", "--dcp-report", str(prefix), "--impl", "merge_engine",
         "-k", "zero_weight or nan_and_inf or envelope or send_buffer_matches or "
               "fp32_mutants_fail or not_powers_of_two",
         *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    recs = [json.loads(ln) for ln in Path(str(prefix) + ".results.jsonl").read_text().splitlines()]
    tests = {r["nodeid"].split("::")[-1]: r for r in recs if r.get("event") == "test"}
    assert tests, proc.stdout[-3000:] + proc.stderr[-2000:]

    def sev(name):
        return tests[name].get("severity", {}).get("severity")

    # a head dim outside the envelope, where the test is about head dims: outside
    odd = tests[f"test_head_dims_not_powers_of_two[{DEV}-torch.float16-80]"]
    assert odd["outcome"] == "skipped" and odd["text"].startswith(
        "outside the envelope: head dim 80"), odd
    # fp32 outputs at LSEs of 30-50, weights from fl(g): weaker precision, not a defect
    name = f"test_implementation_passes_where_fp32_mutants_fail[{DEV}]"
    f32 = tests[name]
    assert f32["outcome"] == "failed" and sev(name) == "precision", f32
    assert "exp(s_n - fl(g))" in f32["text"], f32["text"][-600:]
    # a NaN partial through a zero weight: a defect; a NaN LSE let in: a convention
    z = f"test_zero_weight_never_lets_nan_in[{DEV}-torch.float16]"
    assert tests[z]["outcome"] == "failed" and sev(z) == "defect", tests[z]
    c = f"test_nan_and_inf_lses_count_as_minus_inf[{DEV}-torch.float16]"
    assert tests[c]["outcome"] == "failed" and sev(c) == "convention", tests[c]
    # the wire: not applicable, neither passed nor failed
    wire = [r for n, r in tests.items() if n.startswith("test_send_buffer_matches_spec")]
    assert wire and all(r["outcome"] == "skipped" and r["text"].startswith("not applicable: wire")
                        for r in wire)
    # the declared limit: reported once, with what the engine said
    lim = [r for n, r in tests.items() if n.startswith("test_declared_limits")]
    texts = sorted(r["text"] for r in lim)
    assert any(t.startswith("envelope limit: head dim 3") and "RuntimeError" in t
               for t in texts), texts
