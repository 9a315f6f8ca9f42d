"""Adapters that map an engine's DCP combine onto the dcp_a2a contract, so the conformance suite
validates that engine as it is released. An adapter holds no copy of the engine's code: it calls
the engine installed here, or reads the functions it needs by name from the engine's published
release at run time (:mod:`._release`).

Specs (``--impl`` or ``$DCP_A2A_IMPL``)::

    ENGINE                  the engine installed in this environment, its default variant
    ENGINE:VARIANT          another of its variants
    ENGINE[:VARIANT]=PATH   its release, not installed: PATH is the wheel, an unpacked
                            package tree, or the source file of its DCP ops

Releases the adapters follow, and how to get them (no install, no dependencies)::

    pip download --no-deps vllm==0.34.0 -d /tmp/engines
    pip download --no-deps sglang==0.5.23 -d /tmp/engines
    pip download --no-deps flashinfer-python==0.7.4 -d /tmp/engines

then ``--impl vllm=/tmp/engines/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl`` (or
:func:`find_release`). What each variant maps, its envelope and what it cannot express are in
its adapter's docstring (:mod:`.vllm`, :mod:`.sglang`, :mod:`.flashinfer`);
:data:`ENGINE_VARIANTS` lists them, the first of each engine its default, and
:data:`GPUS_NEEDED` those that need several GPUs (their adapter refuses, in one line, on a
machine with fewer). ``python -m dcp_a2a.testing.adapters.vllm_defects --impl vllm=WHEEL``
reproduces vLLM 0.34.0's two pack defects.
"""

from __future__ import annotations

import re
from pathlib import Path

# engine -> (distribution on the package index, the release the adapter follows)
RELEASES = {"vllm": ("vllm", "0.34.0"), "sglang": ("sglang", "0.5.23"),
            "flashinfer": ("flashinfer-python", "0.7.4")}

# engine -> variant -> what it runs (the first variant is the engine's default)
ENGINE_VARIANTS = {
    "vllm": {
        "a2a": "packed all-to-all: pack_send, unpack_combine (into=), lse_reduce (masks, "
               "into=, the MLA up-projection w_uv=)",
        "ag_rs": "all-gather the LSEs, reduce-scatter the weighted outputs "
                 "(cp_lse_ag_out_rs): lse_reduce; installed vLLM only",
        "direct": "symmetric-memory direct exchange (DirectDCPA2AWorkspace): lse_reduce; "
                  "installed vLLM, needs >= 2 CUDA GPUs",
    },
    "sglang": {
        "a2a": "packed all-to-all: pack_send, unpack_combine, merge, lse_reduce (no LSE "
               "returned, no masks)",
        "ag_rs_mha": "all-gather the LSEs, all-reduce, head slice (cp_lse_ag_out_rs_mha): "
                     "lse_reduce, base e only",
        "ag_rs_mla": "all-gather the LSEs, Triton correction, reduce-scatter "
                     "(cp_lse_ag_out_rs_mla): lse_reduce, no LSE returned",
        "fi_a2a": "the exchange through FlashInfer's MNNVL all-to-all: lse_reduce; installed "
                  "SGLang and FlashInfer, needs >= 2 Blackwell GPUs",
    },
    "flashinfer": {
        "cascade": "merge_states: merge of N partials (base-2 LSEs)",
        "merge_state": "pairwise merge_state chained over the N partials (base-2 LSEs)",
        "a2a": "decode_cp_a2a_lse_reduce: exchange and merge fused over NCCL symmetric "
               "memory; installed FlashInfer, needs >= 2 CUDA GPUs",
    },
}

# (engine, variant) -> the CUDA GPUs it needs; every other variant runs on one GPU or the CPU
GPUS_NEEDED = {("vllm", "direct"): 2, ("sglang", "fi_a2a"): 2, ("flashinfer", "a2a"): 2}


def engine_variants():
    """[(engine, variant, default?, GPUs needed, what it runs)] of every shipped variant."""
    return [(engine, variant, i == 0, GPUS_NEEDED.get((engine, variant), 0), what)
            for engine, variants in ENGINE_VARIANTS.items()
            for i, (variant, what) in enumerate(variants.items())]


def _version_key(v: str):
    try:
        from packaging.version import Version

        return (0, Version(v))
    except Exception:  # not a version packaging reads: order it after those, by its digits
        return (-1, tuple(int(x) for x in re.findall(r"\d+", v)))


def find_release(engine: str, directory) -> Path | None:
    """The wheel of ``engine`` in ``directory`` (``pip download --no-deps`` puts it there): the
    release the adapter follows if it is there, else the newest; None if there is none.
    ValueError for an engine without an adapter."""
    if engine not in RELEASES:
        raise ValueError(f"no adapter for engine {engine!r} (engines: {', '.join(RELEASES)})")
    dist, follows = RELEASES[engine]
    stem = re.sub(r"[-_.]+", "_", dist).lower()  # a wheel's file name normalises the name
    found = {}
    for wheel in Path(directory).glob("*.whl"):
        name, _, rest = wheel.name.partition("-")
        if re.sub(r"[-_.]+", "_", name).lower() == stem and rest:
            found[wheel] = rest.split("-", 1)[0]
    if not found:
        return None
    exact = [w for w, v in found.items() if v == follows]
    if exact:
        return sorted(exact)[0]
    return max(found, key=lambda w: (_version_key(found[w]), w.name))
