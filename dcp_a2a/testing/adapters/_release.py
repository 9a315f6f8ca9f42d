"""Load named definitions of an engine's published release without installing it.

An engine's DCP ops live in files whose module-level imports pull in the whole engine (vLLM's
``dcp.py`` imports its config, logger and JIT warm-up machinery). The conformance suite needs
only a few functions and Triton kernels of such a file, so it reads them by name, from the
release itself, at run time; nothing of the engine is kept in this repository.

``source`` is one of

* a wheel (``pip download --no-deps vllm==0.34.0 -d DIR``): members are read from the zip;
* a directory holding the engine's package tree (an unpacked wheel, a checkout's python root,
  an installed site-packages): member ``a/b/c.py`` is ``DIR/a/b/c.py``;
* one source file: it stands for the member whose path it ends with, else the member named
  like it, else the first member asked for; other members are read from the tree the file
  sits in, when it sits in one.

:func:`load` takes the top-level definitions (functions and classes with their decorators,
assignments) named in each :class:`Part`, writes them after a prelude of imports into one module
file (Triton reads a kernel's source from its file) and imports it. The file lives in a
directory keyed by the hash of its text, so every process of a run (xdist workers, the ranks
of a process group, torchrun's children) loads the same file, and two releases never mix.
Whatever is missing is named in one line (ValueError).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "DCP_A2A_RELEASE_CACHE"


@dataclass(frozen=True)
class Part:
    """The definitions ``names`` of the release's file ``member`` (its path in the wheel), and
    those of ``optional`` that it defines (what earlier releases lack: the adapter then leaves
    out what they serve)."""

    member: str
    names: tuple[str, ...]
    optional: tuple[str, ...] = ()


class Release:
    """A wheel, a package tree or a source file, read member by member."""

    def __init__(self, source: str | os.PathLike):
        path = Path(source).expanduser()
        if not path.exists():
            raise ValueError(f"{source}: no such file or directory")
        self.path = path.resolve()
        if self.path.is_dir():
            self.kind = "directory"
        elif zipfile.is_zipfile(self.path):
            self.kind = "wheel"
        elif self.path.suffix == ".py":
            self.kind = "file"
        else:
            raise ValueError(f"{source}: neither a wheel, a directory nor a .py source file")

    def describe(self) -> str:
        return f"{self.kind} {self.path}"

    def version(self) -> str | None:
        """The wheel's version (its METADATA), else None."""
        if self.kind != "wheel":
            return None
        with zipfile.ZipFile(self.path) as z:
            for name in z.namelist():
                if name.endswith(".dist-info/METADATA") and name.count("/") == 1:
                    for line in z.read(name).decode("utf-8", "replace").splitlines():
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
        return None

    def _where(self, member: str) -> str:
        return f"{self.path.name}:{member}" if self.kind == "wheel" else member

    def read(self, member: str, members: tuple[str, ...] = ()) -> tuple[str, str]:
        """(text, label) of ``member``; ``members``: every member of this load, which decides
        which of them a single source file stands for. ValueError naming what is missing."""
        if self.kind == "wheel":
            with zipfile.ZipFile(self.path) as z:
                try:
                    data = z.read(member)
                except KeyError:
                    raise ValueError(f"{self.path.name} has no {member}") from None
            return data.decode("utf-8"), self._where(member)
        if self.kind == "directory":
            file = self.path / member
            if not file.is_file():
                raise ValueError(f"{self.path} has no {member}")
            return file.read_text(), str(file)
        own = self._member_of_file(members or (member,))
        if member == own:
            return self.path.read_text(), str(self.path)
        root = self._tree_root(own)
        if root is None or not (root / member).is_file():
            raise ValueError(f"{self.path} is one file; {member} is needed too and is not in a "
                             "tree around it (pass the wheel or the unpacked package tree)")
        return (root / member).read_text(), str(root / member)

    def _member_of_file(self, members) -> str:
        as_posix = self.path.as_posix()
        for m in members:
            if as_posix.endswith("/" + m):
                return m
        for m in members:
            if Path(m).name == self.path.name:
                return m
        return members[0]

    def _tree_root(self, member: str) -> Path | None:
        """The directory the file sits in as ``member`` (``ROOT/member``), or None."""
        depth = member.count("/")
        if not self.path.as_posix().endswith("/" + member):
            return None
        return self.path.parents[depth]


def definitions(text: str, names, where: str, optional=()) -> dict[str, str]:
    """The source of each top-level definition in ``names`` and ``optional`` (functions and
    classes with their decorators, assignments to a plain name), by name. ValueError naming
    those of ``names`` not defined."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    wanted = set(names) | set(optional)
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined = [node.name]
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        elif isinstance(node, ast.Assign):
            defined = [t.id for t in node.targets if isinstance(t, ast.Name)]
            first = node.lineno
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined = [node.target.id]
            first = node.lineno
        else:
            continue
        for name in defined:
            if name in wanted:  # the last definition wins, as when the module runs
                found[name] = "".join(lines[first - 1:node.end_lineno])
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"{where} defines no {', '.join(missing)}")
    return found


def unresolved(module, names) -> dict[str, list[str]]:
    """{name: the global names its code reads that ``module`` does not define} of the functions
    (and Triton kernels) ``names`` of a loaded module: what a release's function would fail on
    (a NameError) when called, because it uses a definition that was not read. Only functions
    whose every path the caller takes should be asked about."""
    import builtins
    import dis
    import types

    def reads(code, found):
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                found.add(ins.argval)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                reads(const, found)
        return found

    missing = {}
    for name in names:
        obj = getattr(module, name, None)
        fn = getattr(obj, "fn", obj)  # a Triton kernel's Python function, or the function
        if isinstance(fn, types.FunctionType):
            lacks = sorted(g for g in reads(fn.__code__, set())
                           if g not in fn.__globals__ and not hasattr(builtins, g))
            if lacks:
                missing[name] = lacks
    return missing


def cache_dir() -> Path:
    """Where written modules live: ``$DCP_A2A_RELEASE_CACHE``, else a per-user directory in the
    system's temporary directory."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"dcp_a2a-releases-{uid}"


def module_text(release: Release, parts, prelude: str) -> tuple[str, list[str]]:
    """The text of the module of ``parts`` (the prelude, then each part's definitions in the
    order named) and the labels of the members read."""
    members = tuple(p.member for p in parts)
    chunks, labels = [], []
    for part in parts:
        text, label = release.read(part.member, members)
        found = definitions(text, part.names, label, part.optional)
        labels.append(label)
        chunks.append(f"# --- from {label}\n\n" + "\n\n".join(
            found[n] for n in (*part.names, *part.optional) if n in found))
    header = ("# Generated by dcp_a2a.testing.adapters._release: definitions read by name from "
              f"{release.describe()}.\n")
    return header + prelude.rstrip("\n") + "\n\n\n" + "\n\n\n".join(chunks) + "\n", labels


def load(source, parts, *, prelude: str, tag: str):
    """The module of ``parts`` of the release ``source`` (see the module's docstring); ``tag``
    names the module file (``tag_<hash>``). ValueError naming what is missing."""
    release = source if isinstance(source, Release) else Release(source)
    text, _ = module_text(release, parts, prelude)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    name = f"_dcp_a2a_{tag}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    directory = cache_dir() / f"{tag}-{digest}"
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / f"{name}.py"
    if not file.is_file() or file.read_text() != text:
        tmp = directory / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, file)  # atomic: a concurrent process sees the old file or this one
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a definition that needs more of the engine than was read
        del sys.modules[name]
        raise ValueError(f"the definitions read from {release.describe()} do not load on "
                         f"their own ({file}): {type(e).__name__}: {e}") from e
    module.__release__ = release
    return module
