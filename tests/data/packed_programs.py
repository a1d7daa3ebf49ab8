"""A user's own program over a packed data set: it parses `Shard.records()` its own way (TensorFlow
ops only: under parameter servers the pipeline runs on the workers, which run no Python of ours), and
it writes down every example id its pipeline reads, so a test can count the reads per example.

The ids go to `read-ids/call-<n>/<random>` relative to the process's working directory (the node's
work dir): a file per 64 ids read, ending in ";"; `n` counts the calls of `train_data` in the process
that traced it. dlinfra reads one batch through `train_data` to check the program against its loss before
training: that is each process's first call (on a mirrored worker, and on the parameter-server
chief), so a reader leaves `call-1` out.
"""

from __future__ import annotations

import itertools

import keras
import tensorflow as tf

from dlinfra.training import Program, Shard

SHAPE = (8, 8, 1)  # `dlinfra data pack digits`: 8x8 grey PNGs
IDS_PER_FILE = 64
END = ";"  # a file cut short by its process's exit lacks it: a reader skips such a file
_calls = itertools.count(1)

FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "id": tf.io.FixedLenFeature([], tf.int64),
}


def _parse(raw: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    ex = tf.io.parse_single_example(raw, FEATURES)
    image = tf.ensure_shape(tf.cast(tf.io.decode_png(ex["image"], channels=1), tf.float32) / 255.0, SHAPE)
    return image, ex["label"], ex["id"]


def _logged(folder: str):
    def log(images: tf.Tensor, labels: tf.Tensor, ids: tf.Tensor):
        # Unique names: dlinfra seeds TensorFlow, so a random number alone repeats its sequence in a
        # restarted worker (whose files would replace its first life's); the time does not.
        unique = [tf.timestamp(), tf.cast(tf.random.uniform([], 0, 2**62, dtype=tf.int64), tf.float64)]
        name = tf.strings.reduce_join(tf.strings.as_string(tf.stack(unique), precision=6), separator="-")
        written = tf.io.write_file(
            tf.strings.join([folder, "/", name]),
            tf.strings.join([tf.strings.reduce_join(tf.strings.as_string(ids), separator=","), END]),
        )
        with tf.control_dependencies([written]):
            return tf.identity(images), tf.identity(labels)

    return log


def digits_counted(training) -> Program:
    def train_data(shard: Shard) -> tf.data.Dataset:
        folder = f"read-ids/call-{next(_calls)}"
        return shard.records().map(_parse).batch(IDS_PER_FILE).map(_logged(folder)).unbatch()

    def eval_data() -> tf.data.Dataset:
        return Shard(0, 1, "shards/eval/*.tfrecord").records().map(lambda raw: _parse(raw)[:2])

    def model() -> keras.Model:
        return keras.Sequential(
            [
                keras.Input(SHAPE),
                keras.layers.Flatten(),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )

    return Program(build_model=model, train_data=train_data, eval_data=eval_data)
