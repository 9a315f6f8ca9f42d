"""Load an implementation of the dcp_a2a contract by spec, for the conformance suite.

SPEC is ``package.module``, ``package.module:attr``, a file ``path/to/adapter.py[:attr]``, or an
engine: ``ENGINE[:VARIANT][=PATH]`` with ENGINE one of :data:`ENGINES` (``vllm``, ``sglang``,
``flashinfer``; :mod:`dcp_a2a.testing.adapters`): the engine installed here, or with ``=PATH`` its
published release (a wheel, or the source file of its DCP ops) read without installing it. The
object provides some of the contract's functions (``lse_pack_dim``, ``pack_send``,
``unpack_combine``, ``lse_reduce``, ``merge``) with the contract's signatures (see the README);
what it exposes decides which clauses judge it (:mod:`dcp_a2a.testing.surfaces`).

Rules (docs/conformance.md, "What --impl accepts"):

* a module is found as ``python -m`` finds it (the working directory first), and a file spec is
  loaded from its directory; either directory also goes on ``$PYTHONPATH``, so the processes the
  suite starts (xdist workers, ranks, torchrun) import the same module;
* no spec at all (no ``--impl``, ``$DCP_A2A_IMPL`` unset): the project's own ``dcp_a2a``;
* an empty spec (``--impl ""``, ``DCP_A2A_IMPL=""``: typically an unset CI variable) is refused,
  never read as "the default": a CI job meant to test an engine must not go green on dcp_a2a;
* a spec that cannot be imported, or whose object has none of the four functions, is refused
  (one usage error at start-up, not one failure per test);
* an object with some of the functions is tested on what it has: a test that calls a missing
  function raises :class:`MissingFunction`, which the suite's plugin turns into a skip naming
  the function.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import repro
from .surfaces import FUNCTIONS, envelope_of, exposed
from .verdicts import IMPL_RAISED

# the four functions of the packed design (``missing`` lists these); ``merge`` is optional
CONTRACT = ("lse_pack_dim", "pack_send", "unpack_combine", "lse_reduce")
DEFAULT_SPEC = "dcp_a2a"
ENV_VAR = "DCP_A2A_IMPL"
# Shipped engine adapters, by the names users pass (``--impl vllm``, ``--impl sglang=PATH``).
ENGINES = ("vllm", "sglang", "flashinfer")
ALIASES = {name: f"dcp_a2a.testing.adapters.{name}" for name in ENGINES}


def engine_spec(spec: str) -> tuple[str, str | None, str | None] | None:
    """(engine, variant, path) of ``ENGINE[:VARIANT][=PATH]``, or None for any other spec."""
    head, eq, path = spec.partition("=")
    name, _, variant = head.partition(":")
    if name not in ENGINES:
        return None
    if eq and not path.strip():
        raise ValueError(f"--impl {spec!r}: nothing after '=' (name the engine's release: its "
                         "wheel or the source file of its DCP ops)")
    return name, (variant or None), (path.strip() or None) if eq else None


class MissingFunction(AttributeError):
    """The implementation under test has no such contract function: the test that called it
    cannot judge this implementation, so the suite skips it with this message."""

    def __init__(self, spec: str, name: str):
        super().__init__(f"implementation {spec} has no {name}")
        self.spec, self.name = spec, name


def missing_function_message(text: str) -> str | None:
    """The message of a :class:`MissingFunction` that ended a formatted traceback (a rank's,
    seen from the parent process), or None."""
    tag = f"{MissingFunction.__module__}.{MissingFunction.__qualname__}: "
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].split(tag, 1)[1] if lines and tag in lines[-1] else None


def resolve_spec(option: str | None = None) -> str:
    """The spec to test: ``option`` (a command line's ``--impl``) when given, else
    ``$DCP_A2A_IMPL`` when set, else ``dcp_a2a``. An empty or blank one is a ValueError."""
    if option is not None:
        if not option.strip():
            raise ValueError("--impl is empty (an unset variable?): name the implementation "
                             "under test as package.module[:attr], or leave --impl out to test "
                             f"{DEFAULT_SPEC} itself")
        return option.strip()
    env = os.environ.get(ENV_VAR)
    if env is not None:
        if not env.strip():
            raise ValueError(f"${ENV_VAR} is set but empty (an unset variable?): name the "
                             f"implementation under test, or unset {ENV_VAR} to test "
                             f"{DEFAULT_SPEC} itself")
        return env.strip()
    return DEFAULT_SPEC


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

    @property
    def surfaces(self) -> frozenset:
        """The surfaces of the contract it exposes (:func:`dcp_a2a.testing.surfaces.exposed`)."""
        return exposed(self.obj)

    def exposes(self, surface: str) -> bool:
        return surface in self.surfaces

    @property
    def envelope(self):
        """Its declared :class:`~dcp_a2a.testing.surfaces.Envelope` (the whole contract if none)."""
        return envelope_of(self.obj)

    @property
    def engine(self) -> str | None:
        """What the adapter says it wraps (``ENGINE``: "vLLM 0.34.0 (...)"), or None."""
        return getattr(self.obj, "ENGINE", None)

    @property
    def module(self) -> str:
        eng = engine_spec(self.spec)
        if eng is not None:
            return ALIASES[eng[0]]
        return ALIASES.get(self.spec, self.spec).partition(":")[0]

    @property
    def file(self) -> str | None:
        """The file of the module the spec names (where the code under test lives)."""
        mod = sys.modules.get(self.module)
        return getattr(mod, "__file__", None)

    def describe(self) -> str:
        """``spec (module path, file)``: exactly what is under test, for reports."""
        where = self.file or "no file"
        name = self.spec if self.module == self.spec else f"{self.spec} = {self.module}"
        if self.engine:
            name += f", {self.engine}"
        return f"{name} ({where})"

    def __getattr__(self, name: str):
        if name in FUNCTIONS:
            fn = getattr(self.obj, name, None)
            if not callable(fn):
                raise MissingFunction(self.spec, name)
            return _traced(name, fn)
        raise AttributeError(name)


def _traced(name: str, fn):
    """``fn`` recording each call for a reproducer (:mod:`.repro`) and marking what it raises
    as raised by the implementation (:mod:`.verdicts`: an exception from a call a test expected
    to succeed is a loud refusal, not a wrong result)."""
    import functools

    @functools.wraps(fn)
    def call(*args, **kwargs):
        repro.record(name, args, kwargs)
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            try:
                setattr(e, IMPL_RAISED, True)
            except (AttributeError, TypeError):
                pass
            raise

    return call


def _put_on_path(directory: str) -> None:
    """``directory`` first on this process's sys.path and on ``$PYTHONPATH``, which every
    process started from here inherits."""
    d = os.path.abspath(directory)
    if d not in sys.path:
        sys.path.insert(0, d)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if d not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([d] + parts)


def _path_from_environment() -> None:
    """Every ``$PYTHONPATH`` entry on this process's sys.path. A process that started before its
    parent put an --impl file's directory there, but inherits the variable later, needs this:
    pytest-xdist's workers are such processes (their sys.path is fixed before the controller's
    pytest_configure runs)."""
    for d in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if d not in sys.path:
            sys.path.insert(0, d)


def importable(spec: str) -> str:
    """``spec`` in module form, its module importable here and in the processes started from
    here: ``path/to/adapter.py[:attr]`` becomes ``adapter[:attr]`` with its directory on the
    path, a package directory ``path/to/pkg[:attr]`` becomes ``pkg[:attr]`` likewise; a module
    that only the working directory holds (``--impl my_adapter`` run next to my_adapter.py)
    gets the working directory on the path, as ``python -m`` would."""
    target, sep, attr = spec.partition(":")
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise ValueError(f"implementation file {target!r} does not exist")
        _put_on_path(str(path.resolve().parent))
        return path.stem + sep + attr
    if os.sep in target or target.startswith("."):  # a path: a package directory
        path = Path(target).expanduser().resolve()
        if not (path / "__init__.py").is_file():
            raise ValueError(f"implementation path {target!r} is neither a .py file nor a "
                             "package directory (one with __init__.py)")
        if not path.name.isidentifier():
            raise ValueError(f"implementation package directory {target!r}: {path.name!r} is "
                             "not a module name")
        _put_on_path(str(path.parent))
        return path.name + sep + attr
    top = target.split(".")[0]
    here = Path.cwd()
    if top.isidentifier() and ((here / f"{top}.py").is_file()
                               or (here / top / "__init__.py").is_file()):
        found = importlib.util.find_spec(top)  # None, or where this process would import it
        if found is None or (found.origin and Path(found.origin).resolve().is_relative_to(
                here.resolve())):
            _put_on_path(str(here))  # also when on sys.path here (python -m): not in children
    return spec


def _load_engine(spec: str, engine: str, variant: str | None, path: str | None) -> Implementation:
    """An engine adapter's implementation object: ``adapters.ENGINE.adapter(variant, source)``.
    Its ImportError or ValueError (the engine missing, a release without the named functions)
    becomes one ValueError naming what is missing."""
    if path is not None:  # every process the suite starts reads the same file
        path = os.path.abspath(os.path.expanduser(path))
        spec = f"{engine}{':' + variant if variant else ''}={path}"
    try:
        mod = importlib.import_module(ALIASES[engine])
        obj = mod.adapter(variant=variant, source=path)
    except (ImportError, ValueError, FileNotFoundError) as e:
        raise ValueError(f"--impl {spec}: {e}") from e
    return Implementation(spec, obj)


def load_impl(spec: str | None = None) -> Implementation:
    """Import the implementation ``spec`` (None: :func:`resolve_spec`'s default). ValueError,
    naming the problem, when it cannot be used at all."""
    spec = resolve_spec(spec) if spec is None else spec
    if not spec.strip():
        raise ValueError("the implementation spec is empty: name it as package.module[:attr]")
    eng = engine_spec(spec)
    if eng is not None:
        return _load_engine(spec, *eng)
    if spec not in ALIASES:
        spec = importable(spec)
        _path_from_environment()
    mod_name, _, attr = ALIASES.get(spec, spec).partition(":")
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        if spec in ALIASES:  # the adapter says what is missing
            raise ValueError(str(e)) from e
        missing = getattr(e, "name", None)
        if missing and not (mod_name == missing or mod_name.startswith(missing + ".")):
            raise ValueError(f"implementation module {mod_name!r} was found, but importing it "
                             f"failed: {e}") from e
        raise ValueError(f"cannot import implementation module {mod_name!r}: {e} (a module of "
                         "your own: run from its directory, put that on PYTHONPATH, or pass "
                         "the file, --impl path/to/adapter.py)") from e
    except SystemExit as e:  # a script, or an adapter bailing out: never the caller's exit
        raise ValueError(f"implementation module {mod_name!r} exited while it was imported "
                         f"(SystemExit({e.code!r})): an implementation must define its "
                         "functions, not run (a script? guard its main with if __name__ == "
                         "'__main__')") from None
    except Exception as e:  # its own code raised while importing: a usage error, not a crash
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        raise ValueError(f"importing implementation module {mod_name!r} raised "
                         f"{type(e).__name__}: {e} ({where.filename}:{where.lineno})") from e
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"implementation spec {spec!r}: {mod_name} has no {attr}") from None
    if inspect.isclass(obj) and any(  # methods that would be called without an instance
            inspect.isfunction(inspect.getattr_static(obj, n, None)) for n in CONTRACT):
        raise ValueError(f"implementation spec {spec!r} names a class whose contract functions "
                         f"are methods: name an instance of it (a module-level IMPL = "
                         f"{obj.__name__}(), then {mod_name}:IMPL) or a module with the "
                         "contract's functions")
    impl = Implementation(spec, obj)
    if not any(impl.has(n) for n in FUNCTIONS):
        raise ValueError(f"{spec} ({impl.file or mod_name}) has none of the contract's "
                         f"functions ({', '.join(FUNCTIONS)}): not an implementation of it")
    try:
        surfaces, _ = impl.surfaces, impl.envelope
    except ValueError as e:
        raise ValueError(f"{spec}: {e}") from None
    if not surfaces:
        has = ", ".join(n for n in FUNCTIONS if impl.has(n))
        raise ValueError(f"{spec} ({impl.file or mod_name}) exposes none of the contract's "
                         f"surfaces: it has only {has} (a merge needs merge() or "
                         "unpack_combine(), the wire pack_send(), the exchange lse_reduce())")
    return impl
