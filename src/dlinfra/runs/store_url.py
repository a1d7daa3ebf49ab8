"""Which results store a URL names: file:///abs/path a directory (runs.store.FileStore), s3://bucket/prefix
an S3 prefix (runs.s3_store.S3Store). The one place a scheme is read, so every reader and writer of
a store (runs, packed data sets, the sizing advisor's and the preflight history's prefixes) accepts
the same URLs and says the same thing about a wrong one."""

from __future__ import annotations

from dlinfra.errors import StoreError
from dlinfra.runs.s3_store import S3Store
from dlinfra.runs.store import FileStore, Store
from dlinfra.spec.input import shown


def open_store(url: str, endpoint_url: str | None = None, region: str | None = None) -> Store:
    """The store at `url`; `endpoint_url` and `region` reach an S3-compatible server (ignored for file://)."""
    if url.startswith("file://"):
        return FileStore(url)
    if url.startswith("s3://"):
        return S3Store(url, endpoint_url=endpoint_url, region=region)
    raise StoreError(f"store URL {shown(url)}: use file:///abs/path or s3://bucket/prefix")
