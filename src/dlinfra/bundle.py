"""Code bundles: the user's training code, packed so that the same files always give the same bytes.

The directory holding the entrypoint file is packed into a tar.gz with sorted entries and zeroed
times, owners and modes (so its sha256 names the code, not the checkout); it goes to the run's store
(see layout) and every node, on any target, runs the code from there. A rerun
copies the bundle of the original run, so it runs the original code even after the files changed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from dlinfra.errors import SpecError
from dlinfra.layout import RunStore
from dlinfra.records import BundlePin

MAX_BUNDLE_BYTES = 50 * 1024 * 1024
SKIPPED_DIRS = {"__pycache__", "node_modules", "venv"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class Bundle:
    data: bytes
    entrypoint: str  # 'relative/file.py:function' inside the bundle

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def pin(self) -> BundlePin:
        return BundlePin(sha256=self.sha256, entrypoint=self.entrypoint, bytes=len(self.data))


def pack_entrypoint(entrypoint: str, base: Path) -> Bundle:
    """Bundle the directory of 'file.py:function' (a path relative to `base`, the spec's directory)."""
    file_name, _, func = entrypoint.rpartition(":")
    path = (base / file_name).resolve()
    if not path.is_file():
        raise SpecError(
            [f"training.entrypoint: {path} does not exist. Fix: give a path relative to the spec file"]
        )
    return Bundle(pack(path.parent), f"{path.name}:{func}")


def _files(root: Path) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts) or path.name.endswith(SKIPPED_SUFFIXES):
            continue
        if path.is_file() and not path.is_symlink():
            found.append(path)
    return found


def pack(root: Path) -> bytes:
    """A reproducible tar.gz of `root`: hidden paths, caches and virtualenvs left out."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        total = 0
        for path in _files(root):
            data = path.read_bytes()
            total += len(data)
            if total > MAX_BUNDLE_BYTES:
                raise SpecError(
                    [
                        f"training.entrypoint: {root} holds over {MAX_BUNDLE_BYTES // 2**20} MB of files. "
                        "Fix: keep the training code in its own directory; read data through training.dataset"
                    ]
                )
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def materialize(store: RunStore, sha256: str, entrypoint: str, work: Path) -> str:
    """Unpack the bundle into the node's work dir; the entrypoint as a path a node can import."""
    target = work / f"code-{sha256[:12]}"
    if not target.exists():
        partial = work / f".code-{sha256[:12]}.partial"
        partial.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(store.bundle(sha256)), mode="r:gz") as tar:
            tar.extractall(partial, filter="data")  # refuses absolute paths and '..'
        partial.replace(target)
    file_name, _, func = entrypoint.rpartition(":")
    return f"{target / file_name}:{func}"
