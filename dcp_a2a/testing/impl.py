"""Load an implementation of the dcp_a2a contract by spec, for the conformance suite.

SPEC is ``package.module``, ``package.module:attr``, or the name of a shipped adapter
(``vllm``: :mod:`dcp_a2a.testing.adapters.vllm`); the object must provide
``lse_pack_dim``, ``pack_send``, ``unpack_combine`` and ``lse_reduce`` with the contract's
signatures (see the README). A missing function is reported, not guessed.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

CONTRACT = ("lse_pack_dim", "pack_send", "unpack_combine", "lse_reduce")
DEFAULT_SPEC = "dcp_a2a"
ENV_VAR = "DCP_A2A_IMPL"
# Shipped adapters, by the short names users pass (``--impl vllm``).
ALIASES = {"vllm": "dcp_a2a.testing.adapters.vllm"}


@dataclass
class Implementation:
    spec: str
    obj: Any

    @property
    def is_project(self) -> bool:
        """The project's own dcp_a2a (which also takes ``backend=``)."""
        return self.spec == DEFAULT_SPEC

    def has(self, name: str) -> bool:
        return callable(getattr(self.obj, name, None))

    def missing(self) -> list[str]:
        return [n for n in CONTRACT if not self.has(n)]

    def __getattr__(self, name: str):
        if name in CONTRACT:
            fn = getattr(self.obj, name, None)
            if fn is None:
                raise AttributeError(f"implementation {self.spec!r} has no {name}")
            return fn
        raise AttributeError(name)


def load_impl(spec: str | None = None) -> Implementation:
    spec = spec or os.environ.get(ENV_VAR) or DEFAULT_SPEC
    mod_name, _, attr = ALIASES.get(spec, spec).partition(":")
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        if spec in ALIASES:  # the adapter says what is missing
            raise ValueError(str(e)) from e
        raise ValueError(f"cannot import implementation module {mod_name!r}: {e}") from e
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"implementation spec {spec!r}: {mod_name} has no {attr}") from None
    return Implementation(spec, obj)
