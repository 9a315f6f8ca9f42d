"""The up-projection kernel's compiled form for an H100/H200 (sm_90), from its PTX (no GPU
needed; tests/kernel/project_ptx_probe.py): 16-bit inputs go through the tensor cores (an
mma/wgmma with an fp32 accumulator), fp32 inputs never through TF32 (the bound of
tolerances.yaml ``up_projection`` assumes fp32 products; TF32 rounds the inputs to 10 bits)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kernel

PROBE = Path(__file__).with_name("project_ptx_probe.py")


@pytest.fixture(scope="module")
def ptx():
    import triton.backends

    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton build has no NVIDIA backend to compile for sm_90")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"project_ptx_probe.py failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def test_16_bit_projection_runs_on_the_tensor_cores_with_fp32_accumulation(ptx):
    code = ptx["decode_bf16"]
    mma = [line for line in code.splitlines() if "mma" in line and ".bf16" in line]
    assert mma, "no bf16 mma/wgmma instruction: the projection is not on the tensor cores"
    assert all(".f32" in line for line in mma), mma[:3]


def test_fp32_projection_never_uses_tf32(ptx):
    code = ptx["decode_fp32"]
    assert "tf32" not in code, "an fp32 projection through TF32 (inputs rounded to 10 bits)"
    assert "fma.rn.f32" in code
