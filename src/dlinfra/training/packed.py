"""Training on a packed data set (`training.dataset.format: tfrecord`) with no user code: records
parsed into images and labels by TensorFlow ops alone, because a parameter-server worker runs its
pipeline as a graph and no Python of ours (see training.staging for where the files come from)."""

from __future__ import annotations

from typing import Any

from dlinfra.spec.model import TrainingSpec
from dlinfra.training.shards import ShardManifest
from dlinfra.training.staging import EVAL_PATTERN


def image_shape(manifest: ShardManifest, training: TrainingSpec) -> tuple[int, int, int]:
    """What the model sees: the packed images' one shape, else training.dataset.shape (each image is
    resized to it; prepare refuses a set of mixed sizes without it)."""
    height, width, channels = manifest.shape or training.dataset.shape
    return height, width, channels


def parser(shape: tuple[int, int, int], resize: bool) -> Any:
    """A record → (image in [0, 1], label); `resize` for images of differing sizes."""
    import tensorflow as tf

    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    height, width, channels = shape

    def parse(raw: Any) -> Any:
        ex = tf.io.parse_single_example(raw, spec)
        image = tf.io.decode_image(ex["image"], channels=channels, expand_animations=False)
        image = tf.image.convert_image_dtype(image, tf.float32)
        if resize:
            image = tf.image.resize(image, (height, width))
        image = tf.ensure_shape(image, shape)
        return image, ex["label"]

    return parse


def packed_program(training: TrainingSpec, manifest: ShardManifest) -> Any:
    """The built-in model over this node's staged shards (the files are the shard: a Shard's index
    and count were applied when they were staged)."""
    import tensorflow as tf

    from dlinfra.training import models
    from dlinfra.training.program import Program, Shard

    shape = image_shape(manifest, training)
    parse = parser(shape, resize=manifest.shape is None)

    def train_data(shard: Shard) -> Any:
        return shard.records().map(parse, num_parallel_calls=tf.data.AUTOTUNE)

    def eval_data() -> Any:
        return Shard(0, 1, EVAL_PATTERN).records().map(parse, num_parallel_calls=tf.data.AUTOTUNE)

    return Program(
        build_model=lambda: models.build(training.model, shape, len(manifest.classes)),
        train_data=train_data,
        eval_data=eval_data,
    )
