"""What an implementation exposes of the contract (its surfaces) and which inputs it takes (its
envelope): what a layered verdict judges, and what it reports as not applicable, or as the
envelope's limit, instead of as a failure.

Surfaces. Engines expose different parts of the DCP combine: FlashInfer a merge of N partials on
one GPU, SGLang a pack and a merge with separate LSE lanes and an exchange, vLLM the packed wire
with masks, a caller's result buffer and the MLA up-projection. Each conformance clause needs one
surface (:data:`CLAUSE_SURFACES`); a test may name more with ``pytest.mark.surface(...)``. An
implementation that does not expose a surface gets "not applicable: SURFACE" for those tests:
never a failure, never counted as a pass.

=============== ======================================================================
surface         what exposes it
=============== ======================================================================
merge           ``merge(outs, lses, is_lse_base_on_e, return_lse)``, or ``unpack_combine`` on
                the packed wire
wire            ``pack_send`` and ``lse_pack_dim``: the packed ``[N, B, H/N, D+P]`` buffer
masking         ``seq_lens`` / ``query_start_loc`` on ``pack_send`` or ``lse_reduce``
exchange        ``lse_reduce(out, lse, group, ...)`` over a process group
caller buffer   ``into=`` on ``unpack_combine`` or ``lse_reduce``: the result written into a
                buffer the caller owns
up-projection   ``w_uv=`` on ``lse_reduce``: MLA's up-projection by W_UV around the exchange
=============== ======================================================================

They are read off the implementation's functions and their parameters, unless it declares
``SURFACES`` (an iterable of the names above) itself.

Envelope. An engine may refuse some valid inputs loudly (vLLM's kernels take power-of-two head
dims only: Triton's ``arange`` refuses anything else). Its adapter declares that envelope
(``ENVELOPE = Envelope(head_dims="power of two")``); tests whose head dim is incidental run
inside it (:meth:`Envelope.fit_head_dim`), tests whose point is a value outside it skip as
"outside the envelope: ...", and ``test_envelope.py`` checks once, per declared limit, that the
engine really refuses there (a declared limit where the engine returns wrong numbers is a defect,
not a limit). An envelope is drawn from what the engine refuses loudly, never from where it gives
wrong numbers.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

# The contract's functions: the four of the packed design and a plain merge of N partials.
FUNCTIONS = ("lse_pack_dim", "pack_send", "unpack_combine", "lse_reduce", "merge")

SURFACES = {
    "merge": "a combine of N partials and their LSEs: merge(), or unpack_combine() on the "
             "packed wire",
    "wire": "the packed [N, B, H/N, D+P] send buffer: pack_send() and lse_pack_dim()",
    "masking": "seq_lens / query_start_loc masks of empty KV shards and padding rows",
    "exchange": "lse_reduce() over a process group",
    "caller buffer": "a result buffer the caller owns: into= on unpack_combine() or "
                     "lse_reduce()",
    "up-projection": "w_uv= on lse_reduce(): MLA's up-projection by W_UV around the exchange",
}

# The surface each clause judges (bad input: the one of the function a test calls, which the
# test names with pytest.mark.surface; envelope: whatever the implementation declares).
CLAUSE_SURFACES = {
    "wire format": ("wire",),
    "merge bound": ("merge",),
    "masking": ("masking",),
    "exchange": ("exchange",),
    "graphs": ("exchange",),
    "caller buffer": ("caller buffer",),
    "up-projection": ("up-projection",),
    "bad input": (),
    "envelope": (),
}

NOT_APPLICABLE = "not applicable: "
OUTSIDE = "outside the envelope: "
ENVELOPE_LIMIT = "envelope limit: "  # test_envelope.py's report of one declared limit


class Unsupported(Exception):
    """Raised by an adapter for a case its engine has no way to express (SGLang's reduce returns
    no LSE; FlashInfer's cascade merges base-2 LSEs only): the test is not applicable, and says
    why, instead of failing. Use it for what the engine's API lacks, never for wrong results."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def parameters(fn) -> set[str]:
    """The names of ``fn``'s parameters (none where it has no signature to read)."""
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: say nothing extra
        return set()


def exposed(obj) -> frozenset[str]:
    """The surfaces ``obj`` (a module or an object with the contract's functions) exposes: its
    ``SURFACES`` if it declares them (ValueError for a name that is not a surface), else what
    its functions and their parameters show."""
    declared = getattr(obj, "SURFACES", None)
    if declared is not None:
        if isinstance(declared, str):
            declared = (declared,)
        names = frozenset(declared)
        unknown = sorted(names - set(SURFACES))
        if unknown:
            raise ValueError(f"SURFACES names {', '.join(map(repr, unknown))}: not a surface of "
                             f"the contract (one of {', '.join(SURFACES)})")
        return names
    fn = {n: getattr(obj, n, None) for n in FUNCTIONS}
    has = {n for n, f in fn.items() if callable(f)}
    found = set()
    if "merge" in has or {"unpack_combine", "lse_pack_dim"} <= has:
        found.add("merge")
    if {"pack_send", "lse_pack_dim"} <= has:
        found.add("wire")
    if "lse_reduce" in has:
        found.add("exchange")
    masked = [n for n in ("pack_send", "lse_reduce") if n in has]
    if any("seq_lens" in parameters(fn[n]) for n in masked):
        found.add("masking")
    if any("into" in parameters(fn[n]) for n in ("unpack_combine", "lse_reduce") if n in has):
        found.add("caller buffer")
    if "lse_reduce" in has and "w_uv" in parameters(fn["lse_reduce"]):
        found.add("up-projection")
    return frozenset(found)


def surfaces_of(item) -> tuple[str, ...]:
    """The surfaces a collected test needs: its ``surface`` markers, else its clause's."""
    named = [s for m in item.iter_markers("surface") for s in m.args]
    if named:
        unknown = [s for s in named if s not in SURFACES]
        if unknown:
            raise ValueError(f"{item.nodeid}: surface marker names {unknown}: not a surface")
        return tuple(dict.fromkeys(named))
    clause = item.get_closest_marker("clause")
    return CLAUSE_SURFACES.get(clause.args[0], ()) if clause else ()


HEAD_DIMS = ("any", "power of two", "even")
WORLD_SIZES = ("any", "at least 2")
LSE_DTYPES = ("float32", "bfloat16", "float16")
BASES = ("e", "2")


def _is_pow2(d: int) -> bool:
    return d >= 1 and d & (d - 1) == 0


@dataclass(frozen=True)
class Envelope:
    """The inputs an engine takes; outside them it refuses loudly (``said``: what it says then,
    per limit, for the report). The default takes everything the contract allows."""

    head_dims: str = "any"                   # "any" | "power of two" | "even"
    min_head_dim: int = 1                    # the smallest head dim it takes
    world_sizes: str = "any"                 # "any" | "at least 2"
    lse_dtypes: tuple = LSE_DTYPES           # LSE dtypes it takes, of LSE_DTYPES
    bases: tuple = BASES                     # LSE bases it merges: "e", "2"
    said: dict = field(default_factory=dict)  # limit name -> the engine's refusal

    def __post_init__(self):
        for name, value, allowed in (("head_dims", self.head_dims, HEAD_DIMS),
                                     ("world_sizes", self.world_sizes, WORLD_SIZES)):
            if value not in allowed:
                raise ValueError(f"Envelope({name}={value!r}): expected one of "
                                 f"{', '.join(map(repr, allowed))}")
        if not isinstance(self.min_head_dim, int) or self.min_head_dim < 1:
            raise ValueError(f"Envelope(min_head_dim={self.min_head_dim!r}): expected an int "
                             ">= 1")
        for name, values, allowed in (("lse_dtypes", self.lse_dtypes, LSE_DTYPES),
                                      ("bases", self.bases, BASES)):
            if isinstance(values, str) or not set(values) <= set(allowed) or not values:
                raise ValueError(f"Envelope({name}={values!r}): expected a non-empty tuple of "
                                 f"{', '.join(map(repr, allowed))}")

    # -- the limits, one at a time
    def head_dim_ok(self, d: int) -> bool:
        if d < self.min_head_dim:
            return False
        if self.head_dims == "power of two":
            return _is_pow2(d)
        if self.head_dims == "even":
            return d % 2 == 0
        return True

    def fit_head_dim(self, d: int) -> int:
        """The smallest head dim >= ``d`` inside the envelope: for tests whose head dim is
        incidental, so that a limit never stops a test before what it checks."""
        while not self.head_dim_ok(d):
            d += 1
        return d

    @property
    def base_e(self) -> bool:
        """The LSE base of tests whose base is incidental: e where the envelope takes it."""
        return "e" in self.bases

    def world_size_ok(self, n: int) -> bool:
        return n >= 2 or self.world_sizes == "any"

    def outside(self, *, head_dim: int | None = None, world_size: int | None = None,
                lse_dtype=None, base_e: bool | None = None) -> str | None:
        """Why a case is outside the envelope (a line naming the limit), or None."""
        if head_dim is not None and not self.head_dim_ok(head_dim):
            return f"head dim {head_dim} (head dims: {self._head_dims_text()})"
        if world_size is not None and not self.world_size_ok(world_size):
            return f"a group of {world_size} (world sizes: {self.world_sizes})"
        if lse_dtype is not None:
            name = str(lse_dtype).replace("torch.", "")
            if name not in self.lse_dtypes:
                return f"a {name} LSE (LSE dtypes: {', '.join(self.lse_dtypes)})"
        if base_e is not None and ("e" if base_e else "2") not in self.bases:
            base = "e" if base_e else "2"
            return f"base-{base} LSEs (bases: {', '.join(self.bases)})"
        return None

    def require(self, **case) -> None:
        """Skip the calling test as outside the envelope when ``case`` is (see :meth:`outside`)."""
        why = self.outside(**case)
        if why is not None:
            import pytest

            pytest.skip(OUTSIDE + why)

    def limits(self) -> list[tuple[str, dict]]:
        """[(limit name, one case outside it)] of every declared limit, for the envelope
        check: the first head dim, group, LSE dtype and base the engine says it refuses."""
        found = []
        if self.min_head_dim > 1:
            found.append(("min_head_dim", {"head_dim": self.min_head_dim - 1}))
        if self.head_dims != "any":
            found.append(("head_dims", {"head_dim": next(d for d in range(3, 1 << 12)
                                                         if not self.head_dim_ok(d))}))
        if self.world_sizes != "any":
            found.append(("world_sizes", {"world_size": 1}))
        for name in LSE_DTYPES:
            if name not in self.lse_dtypes:
                found.append(("lse_dtypes", {"lse_dtype": name}))
        for base in BASES:
            if base not in self.bases:
                found.append(("bases", {"base_e": base == "e"}))
        return found

    def _head_dims_text(self) -> str:
        text = "any" if self.head_dims == "any" else f"{self.head_dims} only"
        return text + (f", at least {self.min_head_dim}" if self.min_head_dim > 1 else "")

    def describe(self) -> str:
        """One line: every limit, or "the whole contract"."""
        parts = []
        if self.head_dims != "any" or self.min_head_dim > 1:
            parts.append(f"head dims: {self._head_dims_text()}")
        if self.world_sizes != "any":
            parts.append(f"world sizes: {self.world_sizes}")
        if tuple(self.lse_dtypes) != LSE_DTYPES:
            parts.append(f"LSE dtypes: {', '.join(self.lse_dtypes)}")
        if tuple(self.bases) != BASES:
            parts.append(f"LSE bases: {', '.join(self.bases)}")
        return "; ".join(parts) if parts else "the whole contract"


FULL = Envelope()


def envelope_of(obj) -> Envelope:
    """``obj.ENVELOPE`` (an :class:`Envelope`), else the whole contract."""
    env = getattr(obj, "ENVELOPE", None)
    if env is None:
        return FULL
    if not isinstance(env, Envelope):
        raise ValueError(f"ENVELOPE must be a dcp_a2a.testing.surfaces.Envelope, got "
                         f"{type(env).__name__}")
    return env
