"""The results store: file:// directories and s3:// prefixes behind one small interface.

Keys are '/'-separated paths relative to the run's store URL. Writes are atomic for readers:
files via rename, S3 objects by nature. Multi-file artifacts (checkpoints, models) are uploaded
file by file and then named by a small pointer object, so a reader never sees half of one.

This module holds the interface and the file:// store; the s3:// one is runs.s3_store, and
runs.store_url opens the one a URL names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from dlinfra.errors import StoreError
from dlinfra.runs.local_files import pid_alive


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
    # How often a node that only waits for the run's end asks the store: every request to S3 is billed
    # and counted against its prefix's request rate, so remote stores are asked every few seconds.
    poll_seconds: float = 3.0

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


# A file is written under this folder at the store's root and renamed into its key whole: a writer
# killed mid-write (a node's life ended while it sent a checkpoint) leaves its part here, in no folder
# a user or a listing reads, and the next store opened after it sweeps it away.
STAGING = ".writing"
LEFT_FOR = 60.0  # untouched this long, its writer gone: no write in progress (a stream moves mtime)


class FileStore(Store):
    # A local listing costs microseconds: the run's servers then leave within a fraction of a second
    # of its end, not up to 3 s later with the user's command waiting for them.
    poll_seconds = 0.2

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.root = Path(url[len("file://") :])
        self._real_root = self.root.resolve()
        self._staging = self.root / STAGING
        self._sweep_parts()

    def _sweep_parts(self) -> None:
        """Remove the parts of writers that died mid-write: named by the writer's pid, left untouched."""
        try:
            parts = list(self._staging.iterdir())
        except OSError:  # none yet, or a store this user may only read
            return
        for part in parts:
            pid = part.name.partition("-")[0]
            # gone meanwhile (renamed into its key), or not this user's to remove: left as it is
            with contextlib.suppress(OSError):
                untouched = time.time() - part.stat().st_mtime > LEFT_FOR
                if untouched and pid.isdigit() and not pid_alive(int(pid)):
                    part.unlink()

    def _write(self, dest: Path, fill: Callable[[BinaryIO], object]) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._staging.mkdir(exist_ok=True)
        fd, part = tempfile.mkstemp(dir=self._staging, prefix=f"{os.getpid()}-")
        try:
            with os.fdopen(fd, "wb") as out:
                fill(out)
            os.replace(part, dest)
        except BaseException:
            Path(part).unlink(missing_ok=True)
            raise

    def _path(self, key: str) -> Path:
        path = self.root / checked_key(key)
        if not path.resolve().is_relative_to(self._real_root):  # a symlink inside pointing out
            raise StoreError(f"store key {key[:200]!r} resolves outside {self.root}. Fix: remove the link")
        return path

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(self._path(key), lambda out: out.write(data))

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
            if p.is_file() and STAGING not in p.relative_to(self.root).parts[:1]  # parts, not keys yet
        )

    def put_file(self, key: str, path: Path, tags: dict[str, str] | None = None) -> None:
        if self._path(key).resolve() == path.resolve():
            return
        with open(path, "rb") as fh:
            self.put_opened(key, fh)

    def put_opened(self, key: str, fh: BinaryIO, tags: dict[str, str] | None = None) -> None:
        self._write(self._path(key), lambda out: shutil.copyfileobj(fh, out))

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
