"""Pick how Triton runs before any kernel in this package is defined.

Triton decides at ``@triton.jit`` time whether a kernel is compiled or interpreted
(``TRITON_INTERPRET``). On a machine without CUDA the compiled path cannot run at all, so
importing :mod:`dcp_a2a` there turns the interpreter on unless the user already chose
(``TRITON_INTERPRET=0`` keeps it off; the host wrappers then reject CPU tensors with a clear
error instead of failing inside Triton).
"""

from __future__ import annotations

import os


def _configure() -> bool:
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


INTERPRET: bool = _configure()
