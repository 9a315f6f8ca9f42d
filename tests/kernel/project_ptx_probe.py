"""Print, as JSON, the PTX Triton generates for an H100/H200 (sm_90) for the up-projection
kernel's compiled launch (dcp_a2a.kernels.project) at a decode shape, bf16 and fp32:
``{name: ptx}``. No GPU needed; run with ``TRITON_INTERPRET=0`` (test_project_codegen.py does).
The launches are captured as ptx_probe.py captures them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from ptx_probe import _capture, _meta, _ptx  # noqa: E402  (asserts TRITON_INTERPRET=0)

from dcp_a2a.kernels import project  # noqa: E402

SHAPES = {"decode_bf16": (1, 128, 512, 128, torch.bfloat16),
          "decode_fp32": (1, 32, 512, 128, torch.float32)}

if __name__ == "__main__":
    out = {}
    for name, (b, h, lat, v, dtype) in SHAPES.items():
        x, w, y = _meta(b, h, lat, dtype=dtype), _meta(h, lat, v, dtype=dtype), \
            _meta(b, h, v, dtype=dtype)
        kernel, args, kw = _capture((project._project_kernel,),
                                    lambda: project.project(x, w, y))
        out[name] = _ptx(kernel, args, kw)
    json.dump(out, sys.stdout)
