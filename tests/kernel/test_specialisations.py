"""Launches that need not compile apart share one compiled kernel.

Triton compiles a kernel once per specialisation: its constexprs, launch options, each tensor
argument's element type and each integer's value class. The pack moves float16 and bfloat16
as the same int32 words, so a float16 and a bfloat16 pack of one problem can run one compiled
kernel, but only if every argument has the same type in both: a placeholder pointer typed as
the caller's output compiled the pack twice. On a GPU each needless specialisation is a
compile of its own: the launch-invariance grid's launches (its 8192-row shape aside) asked
for 3378 specialisations, 847 of them such repeats (this placeholder, and the rank of the
symmetric-memory pack and the AG+RS scale kernel, now left unspecialised).

Every launch goes through Triton's own dispatch here: ``DCP_A2A_TRITON_DISPATCH=1`` for the
kernels' launchers made from now on, and the ones earlier tests of the process made (and the
Sites the ops keep from them) set to go through it too; the direct launcher of
``dcp_a2a.kernels.launch`` would bypass the recording.
"""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.inprocess import lse_reduce_in_process
from dcp_a2a.kernels.launch import DISPATCH_ENV
from dcp_a2a.testing.data import partials

pytestmark = pytest.mark.kernel

PACKS = ("_pack_kernel", "_pack_slab_kernel", "_pack_to_peers_kernel")


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"tensor {value.dtype}"
    if isinstance(value, (bool, int, float)):
        return type(value).__name__
    return repr(value)


def _launch_signatures(monkeypatch, device, dtype, seq_lens=None, query_start_loc=None):
    """{kernel name: set of argument-type tuples} of one in-process lse_reduce per backend that
    packs (packed, two_collective, symm_mem) of a problem in ``dtype``."""
    from dcp_a2a.kernels import launch, pack

    monkeypatch.setenv(DISPATCH_ENV, "1")
    for launches in list(launch._ALL.values()):
        monkeypatch.setattr(launches, "usable", False)
    seen: dict[str, set] = {}
    kernel_type = type(pack._pack_kernel)
    original = kernel_type.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        sig = tuple(_describe(a) for a in args) + tuple(
            (k, _describe(v) if isinstance(v, torch.Tensor) else repr(v))
            for k, v in sorted(kwargs.items()))
        seen.setdefault(self.fn.__name__, set()).add(sig)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(kernel_type, "run", recording_run)
    outs, lses = partials(2, 3, 8, 16, dtype, seed=5, device=device)
    for backend in ("packed", "two_collective", "symm_mem"):
        lse_reduce_in_process(list(outs), list(lses), backend=backend, seq_lens=seq_lens,
                              query_start_loc=query_start_loc)
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_float16_and_bfloat16_packs_launch_the_same_types(monkeypatch, device, masked):
    mask = {}
    if masked:  # three requests of one token each, the second with no KV on either rank
        mask = dict(seq_lens=[torch.tensor([1, 0, 2], dtype=torch.int32, device=device)] * 2,
                    query_start_loc=torch.tensor([0, 1, 2, 3], dtype=torch.int32,
                                                 device=device))
    half = _launch_signatures(monkeypatch, device, torch.float16, **mask)
    bf16 = _launch_signatures(monkeypatch, device, torch.bfloat16, **mask)
    packs = [name for name in PACKS if name in half]
    assert packs, f"no pack kernel launched (launched: {sorted(half)})"
    for name in packs:
        assert half[name] == bf16.get(name), (
            f"{name}: a float16 and a bfloat16 pack of one problem launch with different "
            f"argument types, so each compiles a kernel of its own: "
            f"{sorted(half[name] ^ bf16.get(name, set()))}")
