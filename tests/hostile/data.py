"""Classes 6 and 7 of issue 55: data paths that escape, and data errors that can be known before a
cluster starts. Each case builds its files in its scratch directory; no TensorFlow is needed to
refuse any of them (an image is checked by its signature before anything is decoded or written)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

from hostile import Case

SECRET_TEXT = "hostile-data-content-7f3a"  # a file's content that no message may echo


def png(width: int = 4, height: int = 4) -> bytes:
    """A real grey PNG, made without TensorFlow or Pillow."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(range(width)) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def image_tree(root: Path, per_class: int = 6) -> Path:
    for name in ("cats", "dogs"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            (root / name / f"{i}.png").write_bytes(png())
    return root


def _experiment(work: Path, dataset: dict[str, object], script: bool = True) -> Path:
    """`script`: a program of the user's reads the data (the built-in model asks more of own files)."""
    spec = work / "exp" / "experiment.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    training = {"dataset": dataset, "steps": 10} | ({"command": ["python", "-c", "pass"]} if script else {})
    spec.write_text(json.dumps({"training": training}))
    return spec


def _outside(work: Path) -> None:
    (work / "elsewhere").mkdir()
    (work / "elsewhere" / "train-0.tfrecord").write_text(SECRET_TEXT)


def _dotdot(work: Path) -> list[str]:
    _outside(work)
    spec = _experiment(work, {"format": "tfrecord", "uri": "file://../elsewhere/train-*"})
    return ["validate", str(spec)]


def _symlink_out(work: Path) -> list[str]:
    _outside(work)
    spec = _experiment(work, {"format": "tfrecord", "uri": "file://data/train-*"})
    (spec.parent / "data").symlink_to(work / "elsewhere")
    return ["validate", str(spec)]


def _dotdot_meant(work: Path) -> list[str]:
    _outside(work)
    dataset = {"format": "tfrecord", "uri": "file://../elsewhere/train-*", "outside_experiment_dir": True}
    return ["validate", str(_experiment(work, dataset))]


def _s3_dotdot(work: Path) -> list[str]:
    spec = _experiment(work, {"format": "tfrecord", "uri": "s3://team-data/imagenet/../secrets/train-*"})
    return ["validate", str(spec)]


def _files_for_builtin(work: Path) -> list[str]:
    (work / "exp" / "data").mkdir(parents=True)
    (work / "exp" / "data" / "part-0").write_text(SECRET_TEXT)
    return ["validate", str(_experiment(work, {"format": "files", "uri": "file://data/part-*"}, False))]


def _own_tfrecords_bare(work: Path) -> list[str]:
    (work / "exp" / "data").mkdir(parents=True)
    (work / "exp" / "data" / "part-0").write_text(SECRET_TEXT)
    return ["validate", str(_experiment(work, {"format": "tfrecord", "uri": "file://data/part-*"}, False))]


def _own_files(work: Path, sizes: dict[str, int]) -> Path:
    data = work / "exp" / "data"
    data.mkdir(parents=True)
    for name, size in sizes.items():
        (data / name).write_bytes(b"\x00" * size)
    return _experiment(work, {"format": "tfrecord", "uri": "file://data/part-*"})


def _empty_file(work: Path) -> list[str]:
    return ["deploy", str(_own_files(work, {"part-0": 64, "part-1": 0, "part-2": 64}))]


def _packed(work: Path, on_disk: dict[str, bytes]) -> Path:
    """A manifest as `data pack` writes it, naming two train and one eval shard of 32 bytes each,
    beside the files `on_disk` (what is in the directory now)."""
    packed = work / "exp" / "packed"
    packed.mkdir(parents=True)
    names = {"train": ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]}
    names["eval"] = ["eval-00000-of-00001.tfrecord"]
    splits = {
        split: {
            "shards": [{"name": n, "records": 2, "bytes": 32, "sha256": "0" * 64} for n in shard_names],
            "records": 2 * len(shard_names),
            "per_class": {},
        }
        for split, shard_names in names.items()
    }
    manifest = {"source": "pets", "encoding": "png", "shape": [4, 4, 1], "classes": ["a", "b"]}
    (packed / "manifest.json").write_text(json.dumps({**manifest, "splits": splits, "created": 0.0}))
    for name, data in on_disk.items():
        (packed / name).write_bytes(data)
    return _experiment(work, {"format": "tfrecord", "uri": "file://packed"})


def _shard_changed(work: Path) -> list[str]:
    files = {"train-00000-of-00002.tfrecord": b"x" * 32, "train-00001-of-00002.tfrecord": b"x" * 7}
    spec = _packed(work, {**files, "eval-00000-of-00001.tfrecord": b"x" * 32})
    return ["deploy", str(spec), "--workers", "1"]


def _shard_missing(work: Path) -> list[str]:
    spec = _packed(
        work, {"train-00000-of-00002.tfrecord": b"x" * 32, "eval-00000-of-00001.tfrecord": b"x" * 32}
    )
    return ["deploy", str(spec), "--workers", "1"]


def _pack_into_source(work: Path) -> list[str]:
    source = image_tree(work / "pets")
    return ["data", "pack", str(source), str(source / "packed"), "--shards", "2"]


def _earlier_pack_in_source(work: Path) -> list[str]:
    source = image_tree(work / "pets")
    (source / "packed").mkdir()
    (source / "packed" / "manifest.json").write_text("{}")
    (source / "packed" / "train-00000-of-00001.tfrecord").write_bytes(b"x")
    return ["data", "pack", str(source), str(work / "out"), "--shards", "2"]


def _text_as_png(work: Path) -> list[str]:
    source = image_tree(work / "pets")
    (source / "dogs" / "notes.png").write_text(SECRET_TEXT)
    return ["data", "pack", str(source), str(work / "out"), "--shards", "2"]


def _dest_unwritable(work: Path) -> list[str]:
    return ["data", "pack", str(image_tree(work / "pets")), "/proc/dlinfra-pack", "--shards", "2"]


def _dest_is_a_file(work: Path) -> list[str]:
    (work / "a-file").write_text(SECRET_TEXT)
    return ["data", "pack", str(image_tree(work / "pets")), str(work / "a-file"), "--shards", "2"]


def _dest_holds_other_files(work: Path) -> list[str]:
    (work / "out").mkdir()
    (work / "out" / "thesis.tex").write_text(SECRET_TEXT)
    return ["data", "pack", str(image_tree(work / "pets")), str(work / "out"), "--shards", "2"]


CASES = [
    Case("data-relative-uri-dotdot", _dotdot, ("training.dataset.uri", "outside_experiment_dir: true")),
    Case("data-relative-uri-symlink-out", _symlink_out, ("training.dataset.uri", "outside_experiment_dir")),
    Case("data-relative-uri-dotdot-meant", _dotdot_meant, ("valid",), code=0),
    Case("data-s3-key-dotdot", _s3_dotdot, ("training.dataset.uri", "'..'", "Fix:")),
    Case("data-validate-files-for-builtin", _files_for_builtin, ("training.command", "Fix:")),
    Case("data-validate-own-tfrecords-bare", _own_tfrecords_bare, ("eval_uri", "shape", "classes", "Fix:")),
    Case("data-plan-empty-file", _empty_file, ("part-1", "empty", "Fix:"), absent=(SECRET_TEXT,)),
    Case("data-plan-shard-changed", _shard_changed, ("train-00001-of-00002.tfrecord", "7 bytes", "Fix:")),
    Case("data-plan-shard-missing", _shard_missing, ("train-00001-of-00002.tfrecord", "missing", "Fix:")),
    Case("data-pack-dest-inside-source", _pack_into_source, ("inside", "pets", "Fix:")),
    Case("data-pack-earlier-pack-in-source", _earlier_pack_in_source, ("packed", "manifest.json", "Fix:")),
    Case("data-pack-text-named-png", _text_as_png, ("notes.png", "PNG", "Fix:"), absent=(SECRET_TEXT,)),
    Case("data-pack-dest-unwritable", _dest_unwritable, ("/proc/dlinfra-pack", "Fix:")),
    Case("data-pack-dest-is-a-file", _dest_is_a_file, ("a-file", "Fix:"), absent=(SECRET_TEXT,)),
    Case("data-pack-dest-holds-other-files", _dest_holds_other_files, ("thesis.tex", "Fix:")),
]
