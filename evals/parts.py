"""Carry a prepared model to a machine without a package index: split its GGUF into parts of
at most 60 MiB with a manifest, and join them there, verified.

    python -m dcp_a2a.evals.prepare --model NAME --split DIR [--part-mib 60]   # where prepared
    python -m dcp_a2a.evals.prepare --model NAME --join DIR                    # on the GPU node

``--split`` reads the prepared GGUF (``prepare --model NAME`` first) and writes
``DIR/<file>.partNN`` and ``DIR/manifest.json``: the model's name, the whole file's size and
SHA-256 (the registry's, checked while splitting) and each part's name, size and SHA-256.

``--join`` checks the manifest against the registry (evals/registry.py: another model, size or
checksum is refused), then appends the parts in order to ``<cache>/<model>/<file>.partial``,
each one verified (size and SHA-256 against the manifest) before it is appended: a corrupt or
missing part stops the join with one line naming the part. After each part the file is flushed
to disk and the progress recorded (``<file>.join.json``), so a join re-run after an
interruption or a missing part keeps what was appended and verified and reads only the parts
after it. When every part is in, the whole file is hashed once more against the registry,
renamed to its final name and stamped, exactly as ``prepare`` leaves it; the drivers then find
it with ``--model NAME``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .inputs import MissingInput
from .registry import ModelSpec, cached_path, find_gguf, stamp_path

MANIFEST = "manifest.json"
FORMAT = "dcp_a2a.evals model parts 1"
MIB = 1 << 20
MAX_PART_MIB = 60  # what one transfer to the GPU node may carry (64 MiB) with room to spare
_CHUNK = 1 << 22


class PartsError(MissingInput):
    """A split or join step failed: the one line names the part or file and the fix."""


def _sha256_file(path: Path) -> tuple[int, str]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def _write_json(path: Path, obj) -> None:
    """Written to a temporary name and renamed: a reader sees the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


def split(spec: ModelSpec, out_dir: Path, part_mib: int = MAX_PART_MIB,
          cache: Path | None = None, part_bytes: int | None = None) -> Path:
    """Write ``spec``'s prepared GGUF as parts of ``part_mib`` MiB (``part_bytes`` overrides,
    for tests) and the manifest into ``out_dir``; return the manifest's path."""
    size = part_bytes if part_bytes is not None else part_mib * MIB
    if size < 1:
        raise ValueError(f"part size must be at least 1 byte, got {size}")
    src = find_gguf(spec, cache)
    if src is None:
        raise PartsError(f"model {spec.name} is not prepared here (nothing to split)",
                         spec.prepare_command)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)  # a stale manifest must not describe new parts
    whole = hashlib.sha256()
    parts, total = [], 0
    width = max(2, len(str(-(-spec.size // size))))
    with open(src, "rb") as fh:
        while True:
            data = fh.read(size)
            if not data:
                break
            name = f"{spec.gguf_name}.part{len(parts) + 1:0{width}d}"
            (out_dir / name).write_bytes(data)
            whole.update(data)
            total += len(data)
            parts.append({"name": name, "size": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()})
    if total != spec.size or whole.hexdigest() != spec.sha256:
        raise PartsError(f"{src}: {total} bytes with sha256 {whole.hexdigest()}, expected "
                         f"{spec.size} with {spec.sha256}", f"{spec.prepare_command} --force")
    manifest = {"format": FORMAT, "model": spec.name, "file": spec.gguf_name,
                "size": spec.size, "sha256": spec.sha256, "part_bytes": size, "parts": parts}
    _write_json(out_dir / MANIFEST, manifest)
    return out_dir / MANIFEST


def read_manifest(spec: ModelSpec, parts_dir: Path) -> dict:
    """The manifest in ``parts_dir``, checked against the registry entry ``spec``."""
    path = Path(parts_dir) / MANIFEST
    fix = f"copy the whole directory written by prepare --model {spec.name} --split DIR"
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        raise PartsError(f"{path} not found", fix) from None
    except ValueError as e:
        raise PartsError(f"{path} is not valid JSON ({e})", fix) from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise PartsError(f"{path} is not a parts manifest ({FORMAT!r})", fix)
    if m.get("model") != spec.name:
        raise PartsError(f"{path} holds model {m.get('model')!r}, not {spec.name}",
                         f"pass --model {m.get('model')}, or the parts of {spec.name}")
    if (m.get("size"), m.get("sha256"), m.get("file")) != (spec.size, spec.sha256,
                                                           spec.gguf_name):
        raise PartsError(f"{path} describes {m.get('file')} ({m.get('size')} bytes, sha256 "
                         f"{m.get('sha256')}), but the registry's {spec.name} is "
                         f"{spec.gguf_name} ({spec.size} bytes, sha256 {spec.sha256})",
                         "split the model again with this version of dcp_a2a")
    if sum(p["size"] for p in m["parts"]) != spec.size:
        raise PartsError(f"{path}: its parts add up to {sum(p['size'] for p in m['parts'])} "
                         f"bytes, not {spec.size}", fix)
    return m


def _progress_path(out: Path) -> Path:
    return out.with_name(out.name + ".join.json")


def _resume(partial: Path, progress: Path, manifest: dict) -> tuple[int, int]:
    """(parts already appended and verified, their bytes) from an earlier join of the same
    manifest; (0, 0) when there is none or it does not match. The partial file is cut back to
    the recorded length (a part being appended when the join stopped is appended again)."""
    try:
        rec = json.loads(progress.read_text())
        done, nbytes = int(rec["parts_done"]), int(rec["bytes"])
        same = (rec["sha256"] == manifest["sha256"]
                and rec["parts"] == [p["sha256"] for p in manifest["parts"]])
        if same and partial.stat().st_size >= nbytes == sum(
                p["size"] for p in manifest["parts"][:done]):
            with open(partial, "r+b") as fh:
                fh.truncate(nbytes)
            return done, nbytes
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return 0, 0


def join(spec: ModelSpec, parts_dir: Path, cache: Path | None = None, log=print) -> Path:
    """Assemble ``spec``'s GGUF from the parts in ``parts_dir`` into the model cache (see the
    module docstring); return its path. Resumes an interrupted join of the same parts."""
    manifest = read_manifest(spec, parts_dir)
    found = find_gguf(spec, cache)
    if found is not None:
        log(f"{spec.name}: already prepared ({found})")
        return found
    out = cached_path(spec, cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    progress = _progress_path(out)
    done, nbytes = _resume(partial, progress, manifest)
    parts = manifest["parts"]
    if done:
        log(f"{spec.name}: resuming: parts 1-{done} of {len(parts)} were verified and "
            "appended earlier (not read again)")
    mode = "r+b" if done else "wb"
    with open(partial, mode) as dst:
        dst.seek(nbytes)
        dst.truncate()
        for i in range(done, len(parts)):
            p = parts[i]
            where = Path(parts_dir) / p["name"]
            label = f"part {i + 1} of {len(parts)} ({where})"
            try:
                data = where.read_bytes()
            except FileNotFoundError:
                raise PartsError(f"{label} is missing ({i} of {len(parts)} parts are joined "
                                 "so far)", "copy it there and run the same --join again: "
                                 "the joined parts are kept") from None
            digest = hashlib.sha256(data).hexdigest()
            if len(data) != p["size"] or digest != p["sha256"]:
                raise PartsError(f"{label} is corrupt: {len(data)} bytes with sha256 {digest}, "
                                 f"the manifest says {p['size']} bytes with {p['sha256']}",
                                 "copy that part again and run the same --join: the parts "
                                 "before it are kept")
            dst.write(data)
            dst.flush()
            os.fsync(dst.fileno())  # on disk before the progress record says so
            nbytes += len(data)
            _write_json(progress, {"sha256": manifest["sha256"], "parts_done": i + 1,
                                   "bytes": nbytes, "parts": [q["sha256"] for q in parts]})
            log(f"{spec.name}: {label} verified and appended")
    size, digest = _sha256_file(partial)
    if size != spec.size or digest != spec.sha256:
        # the parts were right one by one, so the partial file changed under the join
        partial.unlink(missing_ok=True)
        progress.unlink(missing_ok=True)
        raise PartsError(f"the joined file has {size} bytes with sha256 {digest}, expected "
                         f"{spec.size} with {spec.sha256} (removed)",
                         "run the same --join again (it starts over)")
    partial.replace(out)
    stamp_path(out).write_text(f"{digest} {size}\n")
    progress.unlink(missing_ok=True)
    return out
