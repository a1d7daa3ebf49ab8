"""The results store on S3 (and S3-compatible servers: MinIO, moto): the Store interface over boto3,
with retries that outlast an outage of the store and compare-and-swap on ETags for owners' leases.
runs.store_url.open_store opens it for s3:// URLs; the interface and the file:// store are in runs.store."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlencode

from dlinfra.errors import StoreError
from dlinfra.runs.store import Listed, Store, checked_key, parse_s3_url

T = TypeVar("T")


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
        self._retried = False  # botocore retried since _retrying began a call: its retries hide outages

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
            self._client.meta.events.register("needs-retry.s3", self._note_retry)
        return self._client

    def _note_retry(self, caught_exception: Exception | None = None, response: Any = None, **_: Any) -> None:
        """Told of every attempt; returns None, so botocore's own handler alone decides to retry."""
        status = response[1].get("ResponseMetadata", {}).get("HTTPStatusCode", 200) if response else 200
        if caught_exception is not None or status >= 500:
            self._retried = True
            self._down_since = self._down_since or time.time()  # not the call's start: a long upload's

    def _key(self, key: str) -> str:
        checked_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _retrying(self, action: Callable[[], T], what: str) -> T:
        """Outlast an outage of the store (botocore's own retries give up after seconds)."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + self.retry_for
        delay, failed, began = 0.5, False, time.time()
        self._retried = False
        while True:
            try:
                done = action()
                if failed or self._retried:
                    self.reachable_since = time.time()
                    self.last_outage = (self._down_since or began, self.reachable_since)
                    self._down_since = None
                return done
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code in ("AccessDenied", "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                    raise StoreError(
                        f"{what} {self.url}: {code}. Fix: check the bucket and credentials"
                    ) from None
                if time.monotonic() > deadline:
                    raise StoreError(f"{what} {self.url}: {exc}") from None
                failed = True
            except (BotoCoreError, S3UploadFailedError) as exc:  # upload_file wraps a 5xx in the latter
                if time.monotonic() > deadline:
                    raise StoreError(f"{what} {self.url}: {exc}") from None
                failed = True
            self._down_since = self._down_since or time.time()  # across calls: an outage outlasting one
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
            self.client.upload_fileobj(KeptOpen(fh), self.bucket, self._key(key), ExtraArgs=extra)

        self._retrying(put, "upload")


class KeptOpen:
    """A file object as boto's transfer may have it: s3transfer closes the file of an upload that
    failed, and the retry after an outage longer than botocore's own retries then met a closed file
    (ValueError: seek of closed file), which ended the upload at once. The caller closes it."""

    def __init__(self, fh: BinaryIO):
        self._fh = fh

    def read(self, size: int = -1) -> bytes:
        return self._fh.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def close(self) -> None:
        pass
