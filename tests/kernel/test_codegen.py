"""What the compiled kernels make the GPU wait for, read from the PTX Triton generates for an
H100/H200 (sm_90) at a decode launch, a mid-size one and two large ones (tests/kernel/ptx_probe.py;
no GPU needed: Triton compiles for a named target).

A decode-size launch is about one memory round trip on top of the launch itself, so a second
round trip in series is a slower kernel that every correctness test still passes: the pack
once loaded the LSE after its stores (the compiler cannot move a load above a store that may
alias it), and the combine once reduced an [N, rows] LSE tile across threads, whose warp
shuffles ptxas put in front of the data loads (docs/perf_history.md, fourth pass). The decode pack
also once moved its tile through shared memory between its loads and its stores, behind a
run-time division (docs/perf_history.md, sixth pass).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kernel

PROBE = Path(__file__).with_name("ptx_probe.py")


@pytest.fixture(scope="module")
def ptx():
    import triton.backends

    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton build has no NVIDIA backend to compile for sm_90")
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"ptx_probe.py failed:\n{proc.stderr[-3000:]}"
    return {k: v.splitlines() for k, v in json.loads(proc.stdout).items()}


def _lines(ptx, needle):
    return [i for i, line in enumerate(ptx) if needle in line]


@pytest.mark.parametrize("shape", ["decode", "decode_fp32_d512", "mid_fp32", "large",
                                   "large_fp32", "slab_fp32_d512", "large_fp32_d512"])
def test_pack_issues_every_load_before_its_first_store(ptx, shape):
    code = ptx[f"pack_{shape}"]
    loads, stores = _lines(code, "ld.global"), _lines(code, "st.global")
    assert loads and stores
    assert max(loads) < min(stores), (
        f"a load after the first store (PTX lines {[i for i in loads if i > min(stores)]}): "
        "the pack waits for two memory round trips in series")


@pytest.mark.parametrize("shape", ["decode", "decode_fp32_d512"])
def test_decode_pack_goes_from_its_loads_to_its_stores(ptx, shape):
    """At decode sizes the pack's loads are in the layout of its stores (the tile does not go
    through shared memory and a CTA barrier between them), and its wire offsets divide by the
    heads a peer as a constant (a run-time division was some twenty dependent instructions
    a head lane): both sat between the loads and the stores of a launch that only waits."""
    code = ptx[f"pack_{shape}"]
    assert not _lines(code, "st.shared") and not _lines(code, "bar.sync"), "shared-memory shuffle"
    assert not [line for line in code if "div." in line or "rem." in line], "run-time division"


@pytest.mark.parametrize("shape", ["decode", "mid_fp32", "large"])
def test_combine_loads_everything_before_the_merge_math(ptx, shape):
    code = ptx[f"combine_{shape}"]
    assert not _lines(code, "shfl.sync"), "warp shuffles in the combine's merge weights"
    loads, exps = _lines(code, "ld.global"), _lines(code, "ex2.approx")
    assert loads and exps
    assert max(loads) < min(exps), "a data load issued after the merge weights"


@pytest.mark.parametrize("shape", ["large", "large_fp32", "slab_fp32_d512"])
def test_large_pack_stores_16_byte_vectors(ptx, shape):
    """The slab kernel's point: the wire stores are 16-byte vectors (all but one instruction,
    which writes the chunk's last G/4 vectors, 1/(W+1) of it, from a tile too small to give
    each thread a vector), and the words are shuffled in registers, not through shared memory
    (a barrier and a round trip there)."""
    code = ptx[f"pack_{shape}"]
    stores = [code[i] for i in _lines(code, "st.global")]
    narrow = [line for line in stores if "st.global.v4" not in line]
    assert len(stores) - len(narrow) >= 2 and len(narrow) <= 1, stores
    assert not _lines(code, "st.shared") and not _lines(code, "bar.sync")
