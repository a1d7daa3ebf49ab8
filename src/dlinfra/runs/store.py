"""The results store: file:// directories and s3:// prefixes behind one small interface.

Keys are '/'-separated paths relative to the run's store URL. Writes are atomic for readers:
files via rename, S3 objects by nature. Multi-file artifacts (checkpoints, models) are uploaded
file by file and then named by a small pointer object, so a reader never sees half of one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, TypeVar
from urllib.parse import urlencode

from dlinfra.errors import StoreError
from dlinfra.spec.input import shown

T = TypeVar("T")


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

    @staticmethod
    def from_url(url: str, endpoint_url: str | None = None, region: str | None = None) -> Store:
        if url.startswith("file://"):
            return FileStore(url)
        if url.startswith("s3://"):
            return S3Store(url, endpoint_url=endpoint_url, region=region)
        raise StoreError(f"store URL {shown(url)}: use file:///abs/path or s3://bucket/prefix")

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


class S3Store(Store):
    """boto3 with adaptive retries; `endpoint_url` reaches S3-compatible servers (MinIO, moto)."""

    def __init__(
        self, url: str, endpoint_url: str | None = None, region: str | None = None, retry_for: float = 60
    ):
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parse_s3_url(url)
        self.endpoint_url, self.region = endpoint_url, region
        self.retry_for = retry_for
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint_url,
                region_name=self.region or "us-east-1",
                config=Config(
                    retries={"max_attempts": 8, "mode": "adaptive"},
                    connect_timeout=5,
                    read_timeout=30,
                    s3={"addressing_style": "path" if self.endpoint_url else "auto"},
                ),
            )
        return self._client

    def _key(self, key: str) -> str:
        checked_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _retrying(self, action: Callable[[], T], what: str) -> T:
        """Outlast an outage of the store (botocore's own retries give up after seconds)."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + self.retry_for
        delay = 0.5
        while True:
            try:
                return action()
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code in ("AccessDenied", "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                    raise StoreError(
                        f"{what} {self.url}: {code}. Fix: check the bucket and credentials"
                    ) from None
                if time.monotonic() > deadline:
                    raise StoreError(f"{what} {self.url}: {exc}") from None
            except (BotoCoreError, S3UploadFailedError) as exc:  # upload_file wraps a 5xx in the latter
                if time.monotonic() > deadline:
                    raise StoreError(f"{what} {self.url}: {exc}") from None
            time.sleep(delay)
            delay = min(delay * 2, 5)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._retrying(
            lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data), "write"
        )

    def get_bytes(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        def get() -> bytes | None:
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise

        return self._retrying(get, "read")

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        def get() -> tuple[bytes, str] | None:
            try:
                got = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise
            return got["Body"].read(), got["ETag"]

        return self._retrying(get, "read")

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """S3's conditional writes (If-Match on the ETag, If-None-Match: *): atomic on the server."""
        from botocore.exceptions import ClientError

        condition = {"IfMatch": version} if version else {"IfNoneMatch": "*"}

        def put() -> str | None:
            try:
                put = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition)
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code")
                if code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409"):
                    return None
                raise
            return str(put["ETag"])

        return self._retrying(put, "write")

    def delete(self, key: str) -> None:
        self._retrying(lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key)), "delete")

    def list_keys(self, prefix: str) -> list[str]:
        def listed() -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._key(prefix.rstrip("/")) + "/"
            )
            skip = len(self.prefix) + 1 if self.prefix else 0
            return sorted(o["Key"][skip:] for page in pages for o in page.get("Contents", []))

        return self._retrying(listed, "list")

    def files(self, starting: str = "") -> list[Listed]:
        def listed() -> list[Listed]:
            head = f"{self.prefix}/" if self.prefix else ""
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=head + starting, Delimiter="/"
            )
            return sorted(
                Listed(o["Key"].rsplit("/", 1)[-1], o["Size"], o["ETag"].strip('"'))
                for page in pages
                for o in page.get("Contents", [])
                if not o["Key"].endswith("/")
            )

        return self._retrying(listed, "list")

    def get_file(self, key: str, path: Path) -> bool:
        """Streamed to disk by boto3's transfer manager (ranged parts in parallel for a big object),
        never whole in memory: a data shard may be gigabytes."""
        from botocore.exceptions import ClientError

        def get() -> bool:
            try:
                self.client.download_file(self.bucket, self._key(key), str(path))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return False
                raise
            return True

        path.parent.mkdir(parents=True, exist_ok=True)
        return self._retrying(get, "read")

    def put_file(self, key: str, path: Path, tags: dict[str, str] | None = None) -> None:
        extra = {"Tagging": urlencode(tags)} if tags else None
        self._retrying(
            lambda: self.client.upload_file(str(path), self.bucket, self._key(key), ExtraArgs=extra), "upload"
        )

    def put_opened(self, key: str, fh: BinaryIO, tags: dict[str, str] | None = None) -> None:
        extra = {"Tagging": urlencode(tags)} if tags else None

        def put() -> None:
            fh.seek(0)  # a retry sends the file again from its start
            self.client.upload_fileobj(fh, self.bucket, self._key(key), ExtraArgs=extra)

        self._retrying(put, "upload")
