"""Print, as JSON, the PTX that Triton generates for an H100/H200 (sm_90) for the launches the
table picks at a few shapes: ``{name: ptx}``. Needs no GPU (Triton compiles for a named
target); run in its own process with ``TRITON_INTERPRET=0`` (test_codegen.py does).

Each launch is captured rather than made: the kernel's ``run`` is replaced, the real host
launcher is called on meta tensors (shapes and strides only), and the captured arguments are
compiled the way Triton's launcher specialises them (ints equal to 1 become constants, ints
divisible by 16 and every pointer carry the 16-divisibility hint).
"""

from __future__ import annotations

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "0", "run with TRITON_INTERPRET=0"
# every launch through kernel[grid] (whose run is replaced below), none through a compiled
# kernel's launcher (dcp_a2a.kernels.launch): there is no GPU to launch on
os.environ["DCP_A2A_TRITON_DISPATCH"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from dcp_a2a.kernels import combine, pack  # noqa: E402
from dcp_a2a.wire import wire_shape  # noqa: E402

_PTR = {torch.int16: "*i16", torch.int32: "*i32", torch.float32: "*fp32",
        torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int64: "*i64"}
_OPTIONS = ("num_warps", "enable_fp_fusion")


def _capture(kernels, launch):
    """(kernel, args, kwargs): the one of ``kernels`` that ``launch()`` runs, and what it
    passes to ``kernel[grid](...)``."""
    seen = []
    for k in kernels:
        k.run = (lambda k: lambda *args, grid=None, warmup=False, **kw:
                 seen.append((k, args, kw)))(k)
    try:
        launch()
    finally:
        for k in kernels:
            del k.run
    (kernel, args, kw), = seen
    return kernel, args, kw


def _ptx(kernel, args, kw) -> str:
    names = kernel.arg_names
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in kw:
            sig[name], consts[name] = "constexpr", kw[name]
            continue
        a = args[i]
        if kernel.params[i].is_constexpr:  # a constexpr passed by position
            sig[name], consts[name] = "constexpr", a
            continue
        if isinstance(a, torch.Tensor):
            sig[name] = _PTR[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, bool):
            sig[name] = "i1"
        elif a == 1:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32" if abs(a) < 2**31 else "i64"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    options = {k: kw[k] for k in _OPTIONS if k in kw}
    src = ASTSource(kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def _meta(*shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def _wire(b, h, d, n, dtype):
    return _meta(*wire_shape(n, b, h // n, d, dtype), dtype=dtype)


def pack_ptx(b, h, d, n, dtype):
    out, lse = _meta(b, h, d, dtype=dtype), _meta(b, h, dtype=torch.float32)
    send = _wire(b, h, d, n, dtype)
    kernel, args, kw = _capture((pack._pack_kernel, pack._pack_slab_kernel),
                                lambda: pack.pack(out, lse, send, h // n))
    return _ptx(kernel, args, kw)


def combine_ptx(b, h, d, n, dtype):
    recv = _wire(b, h, d, n, dtype)
    kernel, args, kw = _capture((combine.combine_rows,),
                                lambda: combine.combine_packed(recv, d, False, False))
    return _ptx(kernel, args, kw)


SHAPES = {  # name: (B, H, D, N, dtype): a decode launch, a mid-size one, the large one
    "decode": (1, 128, 512, 8, torch.bfloat16),
    "decode_fp32_d512": (16, 64, 512, 4, torch.float32),  # two 512-lane heads a program
    "mid_fp32": (256, 32, 512, 4, torch.float32),
    "large": (8192, 64, 512, 4, torch.bfloat16),  # the pack's slab kernel
    "large_fp32": (8192, 32, 128, 4, torch.float32),
    "slab_fp32_d512": (128, 64, 512, 4, torch.float32),  # 8k rows of 512-lane heads: slab
    "large_fp32_d512": (8192, 32, 512, 4, torch.float32),  # the row kernel, head-major
}

if __name__ == "__main__":
    ptx = {}
    for name, shape in SHAPES.items():
        ptx[f"pack_{name}"] = pack_ptx(*shape)
        ptx[f"combine_{name}"] = combine_ptx(*shape)
    json.dump(ptx, sys.stdout)
