"""A data set as TFRecord shards in a store, with the manifest that says what they hold
(`dlinfra data pack`): what a run reads at scale instead of one array in memory.

Each record is a tf.train.Example: `image` (the encoded image: PNG or JPEG bytes), `label` (int64)
and `id` (int64, the example's index in its source, unique within the set: what a reader counts to
check that every example is read once per epoch). Examples are dealt to shards in a fixed shuffled
order, so every shard holds every class and the shards differ in size by one record at most.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from dlinfra import __version__
from dlinfra.runs.bundle import file_sha256
from dlinfra.runs.layout import DATA_MANIFEST
from dlinfra.runs.store import Store
from dlinfra.training import pack_dest
from dlinfra.training.pack_dest import PackError

PACK_SEED = 20161  # fixed: the same source packs into the same shards, byte for byte
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class ShardFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    records: int | None  # None: a file of your own, not counted (nothing reads 200 GB to plan a run)
    bytes: int
    sha256: str | None  # None: a file of your own, known by its size and etag instead
    etag: str | None = None


class Split(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    shards: list[ShardFile]
    records: int | None
    per_class: dict[str, int] = {}  # class name → examples (counted when packed)


class ShardManifest(BaseModel):
    """What `data pack` wrote: which shards train and which evaluate, and every shard's checksum."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["tfrecord", "files"] = "tfrecord"  # files: your own, of any format (listed)
    source: str
    encoding: str  # png | jpeg (as packed) | as-is (an image directory's files, unchanged)
    shape: list[int] | None  # every image's (height, width, channels), when they share one
    classes: list[str]  # label i is classes[i]
    splits: dict[str, Split]  # "train", "eval"
    created: float
    # Where each split's files are, when not beside this manifest: your own files, listed by a glob.
    locations: dict[str, str] | None = None
    dlinfra_version: str = __version__


@dataclass(frozen=True)
class Example:
    id: int
    label: int
    image: Any  # what the source's encode turns into the record's bytes: pixels, or a file's path


SIGNATURES = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}


def _image_bytes(path: Any) -> bytes:
    """An image file's bytes, packed as they are once TensorFlow decoded them: an image that does
    not decode fails here, naming its file, not in every trainer that reads the shard."""
    import tensorflow as tf

    data = Path(path).read_bytes()
    try:
        tf.io.decode_image(data, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as exc:
        reason = exc.message.split("\n", 1)[0][:200]
        raise PackError(
            f"{path}: no image TensorFlow can decode ({reason}). Fix: remove or replace the file"
        ) from None
    return data


def _refuse_no_image(path: Path) -> None:
    """A file named like an image that is none (a text file named .png), known by its first bytes
    before anything is decoded or written."""
    with path.open("rb") as fh:
        head = fh.read(8)
    if not any(head.startswith(signature) for signature in SIGNATURES):
        raise PackError(
            f"{path}: named {path.suffix} but its first bytes are no PNG or JPEG signature. Fix: remove "
            "it, or convert it to PNG or JPEG"
        )


@dataclass(frozen=True)
class Source:
    """Examples to pack, split into train and eval."""

    name: str
    classes: list[str]
    encoding: str
    shape: list[int] | None
    train: list[Example]
    eval: list[Example]
    encode: Callable[[Any], bytes]  # an example's image → the bytes its record holds


def array_source(name: str, x_train: Any, y_train: Any, x_test: Any, y_test: Any, encoding: str) -> Source:
    """Images held as float arrays in [0, 1] (the built-in sets), encoded as each shard is written:
    a pack refused for its shard counts costs no encoding."""
    import numpy as np

    def examples(x: Any, y: Any, first_id: int) -> list[Example]:
        pixels = np.clip(np.rint(x * 255), 0, 255).astype("uint8")
        return [
            Example(first_id + i, int(label), image)
            for i, (image, label) in enumerate(zip(pixels, y, strict=True))
        ]

    def encode(image: Any) -> bytes:
        import tensorflow as tf

        return bytes((tf.io.encode_png if encoding == "png" else tf.io.encode_jpeg)(image).numpy())

    classes = int(max(y_train.max(), y_test.max())) + 1
    return Source(
        name,
        [str(c) for c in range(classes)],
        encoding,
        list(x_train.shape[1:]),
        examples(x_train, y_train, 0),
        examples(x_test, y_test, len(x_train)),
        encode,
    )


def directory_source(root: Path, eval_fraction: float) -> Source:
    """A directory of class sub-directories of JPEG/PNG files, packed as they are. An image goes to
    eval by a hash of its path, so adding images never moves the others between splits."""
    if not root.is_dir():
        raise PackError(f"{root}: not a directory (give a directory of class sub-directories, or digits)")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    for name in classes:
        if (root / name / DATA_MANIFEST).exists():
            raise PackError(
                f"{root / name}: holds a {DATA_MANIFEST}, an earlier pack's, and would be packed as a "
                f"class of images. Fix: move it out of {root}"
            )
    if len(classes) < 2:
        raise PackError(f"{root}: {len(classes)} class sub-directories; a classifier needs at least 2")
    train: list[Example] = []
    held: list[Example] = []
    next_id = 0
    for label, name in enumerate(classes):
        before = next_id
        for path in sorted((root / name).rglob("*")):
            if path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
                continue
            _refuse_no_image(path)
            relative = path.relative_to(root).as_posix()
            share = int(hashlib.sha256(relative.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
            (held if share < eval_fraction else train).append(Example(next_id, label, path))
            next_id += 1
        if next_id == before:
            raise PackError(
                f"{root / name}: no .jpg, .jpeg or .png file, and every sub-directory is a class. Fix: "
                "add its images, or move it out"
            )
    if not train or not held:
        raise PackError(f"{root}: {len(train)} training and {len(held)} eval images: add images")
    return Source(
        root.name, classes, "as-is", None, train, held, _image_bytes
    )  # read as each shard is written


def _dealt(examples: list[Example], shards: int) -> list[list[Example]]:
    order = list(examples)
    random.Random(PACK_SEED).shuffle(order)
    return [order[i::shards] for i in range(shards)]


def _write(examples: list[Example], encode: Callable[[Any], bytes], path: Path) -> ShardFile:
    import tensorflow as tf

    def feature(value: bytes | int) -> tf.train.Feature:
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    with tf.io.TFRecordWriter(str(path)) as writer:
        for ex in examples:
            features = {"image": feature(encode(ex.image)), "label": feature(ex.label), "id": feature(ex.id)}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return ShardFile(
        name=path.name, records=len(examples), bytes=path.stat().st_size, sha256=file_sha256(path)
    )


def _refuse_empty_shards(split: str, examples: list[Example], shards: int) -> None:
    if shards > len(examples):
        raise PackError(
            f"--{'eval-' if split == 'eval' else ''}shards {shards}: more shards than the "
            f"{len(examples)} {split} examples; give at most {len(examples)}"
        )


def _split(source: Source, split: str, examples: list[Example], shards: int, out: Path) -> Split:
    written = [
        _write(part, source.encode, out / f"{split}-{i:05d}-of-{shards:05d}.tfrecord")
        for i, part in enumerate(_dealt(examples, shards))
    ]
    counts = Counter(source.classes[ex.label] for ex in examples)
    return Split(shards=written, records=len(examples), per_class=dict(sorted(counts.items())))


def pack(source: Source, dest: Store, shards: int, eval_shards: int) -> ShardManifest:
    """Write the shards and their manifest to `dest`, which then holds this pack alone: whole or
    unchanged (see pack_dest); the manifest goes last, so a reader never sees a manifest naming a
    shard that is not there yet."""
    _refuse_empty_shards("train", source.train, shards)
    _refuse_empty_shards("eval", source.eval, eval_shards)
    with pack_dest.landing(dest) as out:
        splits = {
            "train": _split(source, "train", source.train, shards, out),
            "eval": _split(source, "eval", source.eval, eval_shards, out),
        }
        manifest = ShardManifest(
            source=source.name,
            encoding=source.encoding,
            shape=source.shape,
            classes=source.classes,
            splits=splits,
            created=time.time(),
        )
        pack_dest.write_manifest(out, manifest.model_dump(mode="json"))
    return manifest


def records(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(id, label, encoded image) of every record of one local shard, in order."""
    import tensorflow as tf

    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    for raw in tf.data.TFRecordDataset(str(path)):
        ex = tf.io.parse_single_example(raw, spec)
        yield int(ex["id"]), int(ex["label"]), bytes(ex["image"].numpy())
