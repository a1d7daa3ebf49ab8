"""A user's own TFRecord files, as a tool other than dlinfra writes them: digits as JPEGs under keys
of their own (`image/encoded`, `image/class/label`, plus one the reader ignores), named like
ImageNet's (`train-00003-of-00008`, no `.tfrecord`), the eval files in a directory of their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np

OWN_KEYS = {"image": "image/encoded", "label": "image/class/label"}


def _example(image: bytes, label: int) -> bytes:
    import tensorflow as tf

    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"JPEG"])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(folder: Path, prefix: str, x: np.ndarray, y: np.ndarray, files: int) -> None:
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    pixels = np.clip(np.rint(x * 255), 0, 255).astype("uint8")
    for f in range(files):
        with tf.io.TFRecordWriter(str(folder / f"{prefix}-{f:05d}-of-{files:05d}")) as writer:
            for image, label in zip(pixels[f::files], y[f::files], strict=True):
                writer.write(_example(tf.io.encode_jpeg(image, quality=95).numpy(), int(label)))


def write_own_digits(root: Path, train_files: int) -> Path:
    """root/train/train-*-of-N and root/validation/validation-*-of-00002, plus a README the train
    glob must not match."""
    from dlinfra.training import data

    arrays = data.load(data.DatasetSpec(), Path("/nonexistent"))  # digits ship with scikit-learn
    _write(root / "train", "train", arrays.x_train, arrays.y_train, train_files)
    _write(root / "validation", "validation", arrays.x_test, arrays.y_test, 2)
    (root / "train" / "README.txt").write_text("not a record file")
    return root
