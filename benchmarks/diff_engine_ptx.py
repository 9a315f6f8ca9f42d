"""Is the engine-design baseline the engine's kernel? Compile both for one GPU target and
compare their PTX instruction by instruction. Needs no GPU: Triton compiles to PTX on any
machine.

    python benchmarks/diff_engine_ptx.py /tmp/vllm_dcp.py [--arch 90]

FILE is vLLM's release: its wheel (``pip download --no-deps vllm==0.34.0``), an unpacked
package tree or its ``vllm/v1/attention/ops/dcp.py``; only ``_dcp_a2a_unpack_combine_kernel``
is read from it, by name. For each (D, wire lanes, N, dtype) of the 17 decode rows, both
kernels are compiled as their wrappers
launch them without the LSE (strides as 32-bit integers, the unit head-dim strides as
constants, no alignment hints: both alike); the instructions are compared after register
numbers, the kernel's name, line records and debug sections are taken out. Exit status 0 when
every pair is the same, 1 otherwise (the differing lines are printed).
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # compile, whatever the machine (set before dcp_a2a's kernels)
    os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # vLLM's loader, beside it

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import dcp_a2a  # noqa: E402
from dcp_a2a.testing import engine_design  # noqa: E402

import benchmark_combine_vs_vllm as vs_vllm  # noqa: E402
from dcp_a2a.testing.tune import DECODE_ROWS  # noqa: E402

_PTR = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}
_SKIP = re.compile(r"^\s*(//|\.loc|\.file|\$L__tmp|\.param|ld\.param|$)")


def _compile(fn, ptr, ints, consts, arch):
    sig = {name: ptr for name in fn.arg_names[:3]}
    sig.update({name: "i32" for name in ints})
    sig.update({name: "constexpr" for name in consts})
    source = ASTSource(fn, sig, {(fn.arg_names.index(k),): v for k, v in consts.items()})
    return triton.compile(source, target=GPUTarget("cuda", arch, 32)).asm["ptx"]


def instructions(ptx: str, name: str) -> list:
    """The PTX's code lines, register numbers and counts taken out, up to the debug sections."""
    code = []
    for line in ptx.splitlines():
        if ".section" in line:
            break
        if not _SKIP.match(line):
            code.append(re.sub(r"%[a-z]+(\d+|<\d+>)?", "%r", line.replace(name, "K")).strip())
    return code


def pair(engine, d, p, n, dtype, arch):
    """(the engine's PTX code lines, the baseline's) for one wire."""
    ptr = _PTR[dtype]
    theirs = engine._dcp_a2a_unpack_combine_kernel
    t_consts = {"recv_stride_D": 1, "out_stride_D": 1, "out_lse_stride_B": 1,
                "out_lse_stride_H": 1, "N": n, "HEAD_DIM": d, "IS_BASE_E": True,
                "RETURN_LSE": False, "LSE_PACK_DIM": p}
    t_ints = [a for a in theirs.arg_names[3:12] if a not in t_consts]
    ours = engine_design._unpack_combine_kernel
    o_consts = {"s_rd": 1, "s_od": 1, "N": n, "D": d, "P": p,
                "BLOCK_D": triton.next_power_of_2(d), "BASE_E": True, "RETURN_LSE": False}
    o_ints = [a for a in ours.arg_names[3:12] if a not in o_consts]
    return (instructions(_compile(theirs, ptr, t_ints, t_consts, arch), theirs.__name__),
            instructions(_compile(ours, ptr, o_ints, o_consts, arch), ours.__name__))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/diff_engine_ptx.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine_file", help="vLLM's vllm/v1/attention/ops/dcp.py")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
    args = ap.parse_args(argv)
    wires = sorted({(d, dcp_a2a.lse_pack_dim(getattr(torch, dt)), n, dt)
                    for _, _, d, n, dt in DECODE_ROWS})
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        engine = vs_vllm.load_engine(args.engine_file, tmp)
        for d, p, n, dt in wires:
            theirs, ours = pair(engine, d, p, n, dt, args.arch)
            diff = list(difflib.unified_diff(theirs, ours, "engine", "baseline", n=0,
                                             lineterm=""))
            differ += bool(diff)
            print(f"D={d} lanes={d + p} N={n} {dt:<8} sm_{args.arch}: {len(theirs)} / "
                  f"{len(ours)} lines, " + ("the same" if not diff else "DIFFERENT"))
            for line in diff[2:]:
                print("   ", line)
    print(f"{len(wires) - differ} of {len(wires)} wires compile to the same PTX "
          f"(triton {triton.__version__})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
