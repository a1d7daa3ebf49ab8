"""Where `dlinfra data pack` lands: a local DEST appears whole or not at all, and no shard of an
earlier pack is left beside a new manifest (a reader would take it for part of the set)."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError
from dlinfra.runs.layout import DATA_MANIFEST
from dlinfra.runs.store import FileStore, Store

# What a pack writes: a DEST holding only these is an earlier pack, which a new one replaces
PACKED_NAME = re.compile(r"(train|eval)-\d{5}-of-\d{5}\.tfrecord|" + re.escape(DATA_MANIFEST))


class PackError(DlinfraError):
    """A source that cannot be packed, or a DEST it cannot land in; the message says what to change."""


def check(dest: Store, source: Path | None) -> None:
    """Refuse a DEST the pack could not land in whole, before anything is read or written:
    `source`, a directory of images, must not hold it (the next pack would read it as a class)."""
    if not isinstance(dest, FileStore):
        return  # S3: its errors come with the first write, and name the bucket
    root = dest.root.absolute()
    if source is not None and root.resolve().is_relative_to(source.resolve()):
        raise PackError(
            f"{root}: DEST is inside the source {source}, so the next pack would read these shards as a "
            "class of images. Fix: name a DEST outside it, e.g. "
            f"{source.resolve().parent / (source.name + '-packed')}"
        )
    if root.exists() and not root.is_dir():
        raise PackError(f"{root}: DEST is a file, not a directory. Fix: name a new directory for the shards")
    if root.is_dir() and (other := next((p for p in root.iterdir() if not _packed(p)), None)):
        raise PackError(
            f"{root}: DEST holds {other.name}, which no pack wrote, and a pack replaces DEST whole. Fix: "
            "name a new or empty directory, or move it out"
        )
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.probe-")
    except OSError as exc:
        raise PackError(
            f"{root}: cannot write there ({exc.strerror or type(exc).__name__}). Fix: name a directory "
            "you can write, e.g. ./packed"
        ) from None
    Path(probe).rmdir()


def _packed(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and bool(PACKED_NAME.fullmatch(path.name))


@contextmanager
def landing(dest: Store) -> Iterator[Path]:
    """A directory to write the shards and the manifest into. Local: beside DEST, renamed to DEST
    once whole (an earlier pack there is replaced; a failed pack changes nothing). S3: a scratch
    directory, uploaded shards first and manifest last, then the earlier pack's other shards removed."""
    if isinstance(dest, FileStore):
        check(dest, None)
        root = dest.root.absolute()
        out = root.with_name(f".{root.name}.packing-{secrets.token_hex(4)}")
        out.mkdir()
        try:
            yield out
            _swap(out, root)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        return
    with tempfile.TemporaryDirectory(prefix="dlinfra-pack-") as tmp:
        yield Path(tmp)
        written = sorted(p.name for p in Path(tmp).iterdir())
        for name in (n for n in written if n != DATA_MANIFEST):
            dest.put_file(name, Path(tmp) / name)
        dest.put_file(DATA_MANIFEST, Path(tmp) / DATA_MANIFEST)
        for stale in dest.files():
            if PACKED_NAME.fullmatch(stale.name) and stale.name not in written:
                dest.delete(stale.name)


def _swap(new: Path, root: Path) -> None:
    """`new` in the place of `root`: readers see the earlier pack or this one, each whole."""
    if not root.exists() or not any(root.iterdir()):
        new.replace(root)  # rename(2) replaces an empty directory in one step
        return
    old = root.with_name(f".{root.name}.replaced-{secrets.token_hex(4)}")
    root.rename(old)
    try:
        new.rename(root)
    except OSError:
        old.rename(root)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_manifest(out: Path, manifest: Any) -> None:
    """As Store.put_json writes it."""
    (out / DATA_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
