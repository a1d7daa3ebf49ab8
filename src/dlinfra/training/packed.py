"""Training on a packed data set (`training.dataset.format: tfrecord`) with no user code: records
parsed into images and labels by TensorFlow ops alone, because a parameter-server worker runs its
pipeline as a graph and no Python of ours (see training.staging for where the files come from)."""

from __future__ import annotations

from typing import Any

from dlinfra.spec.dataset import FeaturesSpec
from dlinfra.spec.training import TrainingSpec
from dlinfra.training.shards import ShardManifest
from dlinfra.training.staging import EVAL_PATTERN


def image_shape(manifest: ShardManifest, training: TrainingSpec) -> tuple[int, int, int]:
    """What the model sees: the packed images' one shape, else training.dataset.shape (each image is
    resized to it; prepare refuses a set of mixed sizes without it)."""
    height, width, channels = manifest.shape or training.dataset.shape
    return height, width, channels


def parser(shape: tuple[int, int, int], resize: bool, features: FeaturesSpec) -> Any:
    """A record → (image in [0, 1], label); `resize` for images of differing sizes. `features` names
    the keys (a packed set's are its defaults) and how the image is stored."""
    import tensorflow as tf

    spec = {
        features.image: tf.io.FixedLenFeature([], tf.string),
        features.label: tf.io.FixedLenFeature([], tf.int64),
    }
    height, width, channels = shape

    def parse(raw: Any) -> Any:
        ex = tf.io.parse_single_example(raw, spec)
        if features.encoding == "raw":
            image = tf.reshape(tf.io.decode_raw(ex[features.image], tf.uint8), shape)
        else:
            image = tf.io.decode_image(ex[features.image], channels=channels, expand_animations=False)
        image = tf.image.convert_image_dtype(image, tf.float32)
        if resize and features.encoding != "raw":
            image = tf.image.resize(image, (height, width))
        image = tf.ensure_shape(image, shape)
        return image, ex[features.label] - features.label_offset

    return parse


def packed_program(training: TrainingSpec, manifest: ShardManifest) -> Any:
    """The built-in model over this node's staged shards (the files are the shard: a Shard's index
    and count were applied when they were staged)."""
    import tensorflow as tf

    from dlinfra.training import models
    from dlinfra.training.program import Program, Shard

    shape = image_shape(manifest, training)
    # your own files may hold images of any size: each is resized to training.dataset.shape
    resize = manifest.shape is None or manifest.locations is not None
    parse = parser(shape, resize, training.dataset.features)

    def train_data(shard: Shard) -> Any:
        return shard.records().map(parse, num_parallel_calls=tf.data.AUTOTUNE)

    def eval_data() -> Any:
        held = Shard(0, 1, EVAL_PATTERN, compression=training.dataset.compression_type)
        return held.records().map(parse, num_parallel_calls=tf.data.AUTOTUNE)

    return Program(
        build_model=lambda: models.build(training.model, shape, len(manifest.classes)),
        train_data=train_data,
        eval_data=eval_data,
    )
