"""The results store: file:// directories and s3:// prefixes behind one small interface.

Keys are '/'-separated paths relative to the run's store URL. Writes are atomic for readers:
files via rename, S3 objects by nature. Multi-file artifacts (checkpoints, models) are uploaded
file by file and then named by a small pointer object, so a reader never sees half of one.

This module holds the interface and the file:// store; the s3:// one is runs.s3_store, and
runs.store_url opens the one a URL names.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from dlinfra.errors import StoreError


def checked_key(key: str) -> str:
    """A key is a relative '/'-path of plain segments, so no key names a place outside its store:
    not absolute, no '.', '..' or empty segment, no backslash or control character."""
    segments = key.split("/")
    if (
        any(segment in ("", ".", "..") for segment in segments)
        or "\\" in key
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in key)
    ):
        raise StoreError(
            f"store key {key[:200]!r} would leave its store (absolute path, '..', empty segment or control "
            "character). Fix: this record or pointer was not written by dlinfra; remove it from the store"
        )
    return key


def parse_s3_url(url: str) -> tuple[str, str]:
    """s3://bucket/some/prefix → ("bucket", "some/prefix")."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


class Listed(NamedTuple):
    """A file directly under a store's root: what a glob of data files is matched against."""

    name: str
    bytes: int
    etag: str  # S3's ETag; a local file's modification time (ns): either changes with the content


class Store:
    url: str
    # When the store last answered after failing to (0: it never failed): what its writers sent in
    # between could not land, so a heartbeat older than this is no sign its node is gone.
    reachable_since: float = 0.0
    # The last outage it outlasted (first failed, answered again), for the record of what a node lived
    # through (node.survived); None: none yet.
    last_outage: tuple[float, float] | None = None
    _down_since: float | None = None

    # -- primitives each backend implements
    def put_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get_bytes(self, key: str) -> bytes | None:
        raise NotImplementedError

    def put_file(self, key: str, path: Path, tags: dict[str, str] | None = None) -> None:
        """`tags`: object tags where the backend has them (S3 lifecycle rules match on them)."""
        raise NotImplementedError

    def list_keys(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder: "notices/"), relative to the store, sorted."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove the key; one that is not there is no error."""
        raise NotImplementedError

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object and a version tag of its content, for `put_if`."""
        raise NotImplementedError

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """Write only if the key still holds `version` (None: only if there is no such key), and
        return the new version; None when another writer came first. One compare-and-swap: what an
        owner's lease is built on."""
        raise NotImplementedError

    def files(self, starting: str = "") -> list[Listed]:
        """The files directly under the root (not in its sub-directories) whose names begin with
        `starting`, by name (S3 lists only those: a glob's literal head spares a big prefix's pages)."""
        raise NotImplementedError

    def get_file(self, key: str, path: Path) -> bool:
        data = self.get_bytes(key)
        if data is None:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return True

    # -- built on the primitives
    def uri(self, key: str = "") -> str:
        return f"{self.url}/{key}" if key else self.url

    def put_json(self, key: str, obj: Any) -> None:
        self.put_bytes(key, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())

    def get_json(self, key: str) -> Any | None:
        data = self.get_bytes(key)
        if data is None:
            return None
        try:
            return json.loads(data)
        except json.JSONDecodeError:
            return None  # a half-synced object on an eventually consistent store: read again later

    def put_opened(self, key: str, fh: BinaryIO, tags: dict[str, str] | None = None) -> None:
        """A file already opened (see runs.local_files: opened with no link followed), from its start."""
        raise NotImplementedError


class FileStore(Store):
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.root = Path(url[len("file://") :])
        self._real_root = self.root.resolve()

    def _path(self, key: str) -> Path:
        path = self.root / checked_key(key)
        if not path.resolve().is_relative_to(self._real_root):  # a symlink inside pointing out
            raise StoreError(f"store key {key[:200]!r} resolves outside {self.root}. Fix: remove the link")
        return path

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        data = self.get_bytes(key)
        return None if data is None else (data, hashlib.sha256(data).hexdigest())

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # writers of one store share its disk: an exclusive lock beside the key makes the check
        # and the write one step for every process
        with open(path.with_name(f".lock-{path.name}"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self.get_versioned(key)
            if (current[1] if current else None) != version:
                return None
            self.put_bytes(key, data)
            return hashlib.sha256(data).hexdigest()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list_keys(self, prefix: str) -> list[str]:
        folder = self._path(prefix.rstrip("/"))
        if not folder.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")  # a write in progress is not a key yet
        )

    def put_file(self, key: str, path: Path, tags: dict[str, str] | None = None) -> None:
        if self._path(key).resolve() == path.resolve():
            return
        with open(path, "rb") as fh:
            self.put_opened(key, fh)

    def put_opened(self, key: str, fh: BinaryIO, tags: dict[str, str] | None = None) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(fh, out)
        os.replace(tmp, dest)

    def files(self, starting: str = "") -> list[Listed]:
        if not self.root.is_dir():
            return []
        return sorted(
            Listed(p.name, (st := p.stat()).st_size, str(st.st_mtime_ns))
            for p in self.root.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.name.startswith(starting)
        )

    def get_file(self, key: str, path: Path) -> bool:
        """Copied, not read into memory: a data shard may be gigabytes."""
        source = self._path(key)
        if not source.is_file():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)
        return True
