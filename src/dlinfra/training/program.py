"""The user program contract — the Estimator idea in Keras terms.

A training program is three functions: build the model, give this shard's training examples,
give the evaluation examples. The same `Program` trains in one process or on N nodes under either
strategy without change; dlinfra owns batching, shuffling, distribution, checkpoints and export.

User code names a function in the experiment file (``training.entrypoint: my_model.py:build``)
that takes the `TrainingSpec` and returns a `Program`::

    def build(training):
        return Program(build_model=..., train_data=..., eval_data=...)

The optional fields say what a model is trained for and measured by (see training.objective for
what wins when a field is left out). `build` itself makes no TensorFlow state: it runs before the
cluster is joined, and a lookup table made there belongs to no device of the cluster. Such objects
go in `setup`, which runs in the strategy's scope on every training process.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlinfra.spec.training import TrainingSpec

if TYPE_CHECKING:
    from dlinfra.training.data import S3Access
    from dlinfra.training.dispatch import Dispatch


@dataclass(frozen=True)
class Shard:
    """Which part of the training data one input pipeline reads: examples i with i % count == index.
    With staged files (training.dataset.format: tfrecord or files) the node's staged files are
    already its part (index 0 of 1): `records()` reads TFRecords, `files` lists them, and `pattern`
    names them for a reader of your own (`tf.data.Dataset.list_files(shard.pattern)`, then e.g.
    `tf.data.TextLineDataset`), which also runs on parameter-server workers."""

    index: int
    count: int
    pattern: str | None = None  # the staged files, relative to the trainer's working directory
    streamed: bool = False  # the files arrive as they are read (training.dataset.cache_gb)
    compression: str = ""  # GZIP or ZLIB: your own files as they were written (dataset.compression)
    # parameter-server workers: any train file, taken from the chief as the worker is free
    dispatch: Dispatch | None = None

    def records(self) -> Any:
        """A tf.data.Dataset of the raw serialized records of this pipeline's files, read on the node
        that runs the pipeline (under parameter servers: each worker, its own files)."""
        if self.pattern is None:
            raise ValueError("Shard.records(): the run reads no packed data (training.dataset.format)")
        import tensorflow as tf

        from dlinfra.training import dispatch, gates

        if self.dispatch is not None:
            return dispatch.dispatched_records(self.dispatch, self.compression)
        if self.streamed:
            return gates.gated_records(self.compression)

        # Listed when the pipeline runs, on the node that runs it; files interleaved in a fixed order.
        return tf.data.Dataset.list_files(self.pattern, shuffle=False).interleave(
            lambda path: tf.data.TFRecordDataset(path, compression_type=self.compression),
            cycle_length=gates.READ_PARALLEL,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    @property
    def files(self) -> list[Path]:
        """This process's staged files (under parameter servers, the chief's: use records()); when
        streamed, those on disk now."""
        return sorted(Path().glob(self.pattern)) if self.pattern else []


@dataclass(frozen=True)
class Program:
    build_model: Callable[[], Any]
    """Returns a fresh keras.Model that outputs logits; called inside the strategy scope."""
    train_data: Callable[[Shard], Any]
    """Returns a tf.data.Dataset of unbatched (features, label) pairs of this shard, or (features,
    label, sample_weight) triples: each example's loss is weighted, as in Keras' fit."""
    eval_data: Callable[[], Any]
    """Returns a tf.data.Dataset of unbatched (features, label) pairs held out from training (or
    triples: the eval loss is weighted, the metrics are not, as compile()'s `metrics` in Keras)."""
    loss: Any = None
    """A Keras loss (an object such as keras.losses.MeanSquaredError(), or a name such as "mse"), or
    a callable(labels, outputs) returning per-example losses. None: the model's compile() loss, else
    sparse categorical cross-entropy on logits (a classifier with integer labels)."""
    metrics: Sequence[Any] = ()
    """Keras metrics (objects, copied from their config where they are used; names such as "mae" or
    "accuracy"; or callables) computed on eval_data after training and reported under their names.
    Empty: compile()'s, else accuracy with the default loss (the eval loss is always reported)."""
    optimizer: Any = None
    """A Keras optimizer (a schedule, clipnorm, weight decay: anything Keras takes), copied from its
    config in the strategy's scope, or a function returning one, called there. None: the model's
    compile() optimizer, else training.optimizer at training.learning_rate (scaled by
    training.lr_scaling)."""
    variable_partitioner: Any = None
    """Parameter servers: a tf.distribute.experimental.partitioners object that splits big variables
    (an embedding too big for one ps) over the ps tasks. Mirrored variables are never split."""
    setup: Callable[[], None] | None = None
    """Runs once in every training process, in the strategy's scope, before build_model and the data
    functions: where lookup tables and preprocessing layers are made (kept in your closure)."""

    def __post_init__(self) -> None:
        # An optimizer instance is made here, in build(), before the cluster is joined: its variables
        # (the learning rate) are on a device the cluster does not have, so even its config cannot be
        # read later. Its config is read now, and a fresh copy made from it in the strategy's scope.
        given = self.optimizer
        if given is not None and not callable(given) and callable(getattr(given, "get_config", None)):
            config, kind = given.get_config(), type(given)
            object.__setattr__(self, "optimizer", lambda: kind.from_config(copy.deepcopy(config)))


def builtin_program(training: TrainingSpec, cache_dir: Path, s3: S3Access | None = None) -> Program:
    """The built-in models and data sets, expressed through the same contract user code uses.
    `s3`: how an s3:// data set is reached (the run store's endpoint and region)."""
    from dlinfra.training import data, models

    arrays = data.load(training.dataset, cache_dir, s3 or data.S3Access())

    def train_data(shard: Shard) -> Any:
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(
            (arrays.x_train[shard.index :: shard.count], arrays.y_train[shard.index :: shard.count])
        )

    def eval_data() -> Any:
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((arrays.x_test, arrays.y_test))

    return Program(
        build_model=lambda: models.build(training.model, arrays.shape, arrays.classes),
        train_data=train_data,
        eval_data=eval_data,
    )


def load_entrypoint(entrypoint: str, training: TrainingSpec) -> Program:
    """Import 'path/to/file.py:function' and call it with the training spec."""
    file_name, _, func_name = entrypoint.rpartition(":")
    path = Path(file_name)
    if not path.is_file():
        raise FileNotFoundError(f"training.entrypoint: {path} not found")
    module_name = f"dlinfra_user_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    assert module_spec and module_spec.loader
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(path.parent.absolute()))  # user code may import its neighbours
    module_spec.loader.exec_module(module)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise AttributeError(f"training.entrypoint: {path} has no function {func_name!r}")
    program = func(training)
    if not isinstance(program, Program):
        raise TypeError(
            f"training.entrypoint: {func_name}() returned {type(program).__name__}, not a Program"
        )
    return program
