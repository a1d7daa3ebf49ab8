"""Your own TFRecord files, named by a glob (`training.dataset.uri: s3://data/imagenet/train-*`):
listed once, when the run is prepared, into the same kind of manifest `dlinfra data pack` writes, so
the nodes stage and shard them as they do packed shards.

Nothing reads the files to plan a run (a set may be terabytes): a file is known by its name, size
and etag (S3's; a local file's modification time). The listing is stored with the run and pinned by
its sha256, so every node, and any rerun, reads exactly the files listed; a rerun lists again and
refuses files that changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from fnmatch import fnmatchcase

from dlinfra.errors import DlinfraError
from dlinfra.runs.store_url import open_store
from dlinfra.spec.dataset import DatasetSpec
from dlinfra.training.shards import ShardFile, ShardManifest, Split


class ListingError(DlinfraError):
    """A glob that lists no usable files; the message says what to change."""


def split_files(
    uri: str, field: str, endpoint_url: str | None, region: str | None, records: bool
) -> list[ShardFile]:
    """`records`: TFRecord files, never a JSON file (a packed set's manifest) that `*` would match."""
    directory, _, pattern = uri.rpartition("/")
    store = open_store(directory, endpoint_url, region)
    found = [
        ShardFile(name=f.name, records=None, bytes=f.bytes, sha256=None, etag=f.etag)
        for f in store.files(re.split(r"[*?\[]", pattern, maxsplit=1)[0])
        if fnmatchcase(f.name, pattern) and not (records and f.name.endswith(".json"))
    ]
    if not found:
        raise ListingError(
            f"training.dataset.{field}: no file under {directory}/ matches {pattern!r}. Fix: check the "
            "glob (it matches file names directly under that directory) and the bucket's region"
        )
    return found


def listed_manifest(ds: DatasetSpec, endpoint_url: str | None, region: str | None) -> ShardManifest:
    """The manifest of the files `ds.uri` (train) and `ds.eval_uri` (eval) match, as they are now."""
    assert ds.uri is not None
    splits, locations = {}, {}
    for split, field, uri in (("train", "uri", ds.uri), ("eval", "eval_uri", ds.eval_uri)):
        files = split_files(uri, field, endpoint_url, region, ds.format == "tfrecord") if uri else []
        splits[split] = Split(shards=files, records=None)
        # no eval_uri: no eval files, and the train files' directory stands as their location
        locations[split] = (uri or ds.uri).rpartition("/")[0]
    encoding = "raw" if ds.features.encoding == "raw" else "as-is"
    return ShardManifest(
        format="files" if ds.format == "files" else "tfrecord",
        source=ds.uri,
        encoding=encoding,
        # your own files: the shape and classes the spec gives (its defaults, unless set)
        shape=list(ds.shape),
        classes=[str(c) for c in range(ds.classes)],
        splits=splits,
        created=0.0,  # a listing's bytes are its pin: the same files list the same
        locations=locations,
    )


def listing_bytes(manifest: ShardManifest) -> bytes:
    """What is stored and pinned: the files alone (no dlinfra version: a newer CLI's rerun matches)."""
    data = manifest.model_dump(mode="json", exclude={"dlinfra_version"})
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def listing_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
