"""Programs written to the widened contract, each an ordinary Keras program a user would write, on
small real data that ships with scikit-learn (no download): regressions, a model with its own
penalty, a compiled model, dict features, a lookup table made in setup, a partitioned embedding."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_diabetes, load_digits

from dlinfra.training import Program, Shard

# ---------------------------------------------------------------- a regression (scikit-learn's diabetes)


def _diabetes() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    data = load_diabetes()
    x = data.data.astype("float32")
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    y = data.target.astype("float32")  # disease progression, 25..346
    return x[:380], y[:380], x[380:], y[380:]


def _regression(**fields) -> Program:
    x_train, y_train, x_test, y_test = _diabetes()

    def model() -> keras.Model:
        return keras.Sequential(
            [keras.Input((10,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
        )

    return Program(
        build_model=model,
        train_data=lambda shard: tf.data.Dataset.from_tensor_slices((x_train, y_train)).shard(
            shard.count, shard.index
        ),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x_test, y_test)),
        **fields,
    )


def regression(training) -> Program:
    """Mean squared error, reported as MAE; a schedule and clipping in its optimizer."""
    return _regression(
        loss="mse",
        metrics=["mae"],
        optimizer=lambda: keras.optimizers.Adam(
            keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=200, decay_rate=0.5), clipnorm=5.0
        ),
    )


def regression_without_a_loss(training) -> Program:
    """The same model on the classifier default: refused, naming Program.loss."""
    return _regression()


def regression_compiled(training) -> Program:
    """Its loss, metric and optimizer said to compile(), as for fit."""
    x_train, y_train, x_test, y_test = _diabetes()

    def model() -> keras.Model:
        m = keras.Sequential(
            [keras.Input((10,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
        )
        m.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.5), loss="mae", metrics=["mse"])
        return m

    return Program(
        build_model=model,
        train_data=lambda shard: tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x_test, y_test)),
    )


def regression_loss_with_a_branch(training) -> Program:
    """A loss of the program's own whose `if` on a tensor only AutoGraph can trace: the mean absolute
    error while the predictions are far off, the squared error once they are close."""

    def loss(y, out):
        error = out - y
        if tf.reduce_mean(tf.abs(error)) > 100.0:
            return tf.reduce_mean(tf.abs(error), -1)
        return tf.reduce_mean(tf.square(error), -1)

    return _regression(loss=loss, metrics=["mae"], optimizer=lambda: keras.optimizers.Adam(0.05))


def regression_broadcasting(training) -> Program:
    """A hand-written loss that broadcasts labels (N,) against outputs (N, 1) into (N, N)."""
    return _regression(loss=lambda y, out: tf.square(tf.reshape(y, [-1]) - out))


# ---------------------------------------------------------------- classifiers on digits


def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    return x[:1500], y[:1500], x[1500:], y[1500:]


def _classifier(model, x_train, y_train, x_test, y_test, **fields) -> Program:
    return Program(
        build_model=model,
        train_data=lambda shard: tf.data.Dataset.from_tensor_slices((x_train, y_train)).shard(
            shard.count, shard.index
        ),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x_test, y_test)),
        **fields,
    )


def _mlp(regularizer=None) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu", kernel_regularizer=regularizer),
            keras.layers.Dense(10, kernel_regularizer=regularizer),
        ]
    )


def labels_shaped_n_by_1(training) -> Program:
    x_train, y_train, x_test, y_test = _digits()
    return _classifier(_mlp, x_train, y_train[:, None], x_test, y_test[:, None])


def float_labels(training) -> Program:
    x_train, y_train, x_test, y_test = _digits()
    return _classifier(_mlp, x_train, y_train.astype("float32"), x_test, y_test.astype("float32"))


def label_out_of_range(training) -> Program:
    x_train, y_train, x_test, y_test = _digits()
    return _classifier(
        lambda: keras.Sequential([keras.Input((64,)), keras.layers.Dense(5)]),
        x_train,
        y_train,
        x_test,
        y_test,
    )


def heavy_penalty(training) -> Program:
    """An L2 penalty so heavy that it must win over the data, as it does under plain Keras fit."""
    x_train, y_train, x_test, y_test = _digits()
    return _classifier(lambda: _mlp(keras.regularizers.L2(10.0)), x_train, y_train, x_test, y_test)


class _OwnStep(keras.Model):
    def train_step(self, data):  # what a user's fit would run; dlinfra's loop would not
        return super().train_step(data)


def custom_train_step(training) -> Program:
    x_train, y_train, x_test, y_test = _digits()

    def model() -> keras.Model:
        inputs = keras.Input((64,))
        return _OwnStep(inputs, keras.layers.Dense(10)(inputs))

    return _classifier(model, x_train, y_train, x_test, y_test)


def dict_features(training) -> Program:
    """Two named inputs (the digit's top and bottom halves), accuracy by its Keras name."""
    x_train, y_train, x_test, y_test = _digits()

    def named(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"top": x[:, :32], "bottom": x[:, 32:]}

    def model() -> keras.Model:
        top, bottom = keras.Input((32,), name="top"), keras.Input((32,), name="bottom")
        hidden = keras.layers.Dense(64, activation="relu")(keras.layers.Concatenate()([top, bottom]))
        return keras.Model({"top": top, "bottom": bottom}, keras.layers.Dense(10)(hidden))

    return _classifier(
        model,
        named(x_train),
        y_train,
        named(x_test),
        y_test,
        metrics=[keras.metrics.SparseCategoricalAccuracy(), keras.metrics.SparseTopKCategoricalAccuracy(k=3)],
    )


def unused_compile_settings(training) -> Program:
    """compile() settings the loop does not use (a loss weight, eager steps): named in the deploy's
    output."""
    x_train, y_train, x_test, y_test = _digits()

    def model() -> keras.Model:
        m = _mlp()
        m.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            loss_weights=[0.5],
            run_eagerly=True,
        )
        return m

    return _classifier(model, x_train, y_train, x_test, y_test)


def zeros_weighted_out(training) -> Program:
    """(x, y, sample_weight) triples that weigh every 0 at nothing: trained as Keras trains them, the
    model never learns to say 0. A Keras metric object and an optimizer instance, made here in build()."""
    x_train, y_train, x_test, y_test = _digits()
    weights = (y_train != 0).astype("float32")
    return Program(
        build_model=_mlp,
        train_data=lambda shard: tf.data.Dataset.from_tensor_slices((x_train, y_train, weights)).shard(
            shard.count, shard.index
        ),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x_test, y_test)),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        optimizer=keras.optimizers.Adam(0.01),
    )


def large_digits_auc(training) -> Program:
    """A yes/no classifier (is the digit 5 or more?) measured by Keras metric objects made in build(),
    AUC among them, with an optimizer instance."""
    x_train, y_train, x_test, y_test = _digits()
    return Program(
        build_model=lambda: keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)]),
        train_data=lambda shard: tf.data.Dataset.from_tensor_slices(
            (x_train, (y_train >= 5).astype("float32"))
        ).shard(shard.count, shard.index),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x_test, (y_test >= 5).astype("float32"))),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.AUC(from_logits=True), keras.metrics.BinaryAccuracy(threshold=0.0)],
        optimizer=keras.optimizers.SGD(0.1),
    )


# ---------------------------------------------------------------- strings, through a table made in setup


def _words() -> tuple[list[str], np.ndarray]:
    """A digit's ink in its top half, as a word; a label says whether the bottom half is inkier."""
    x_train, _, _, _ = _digits()
    top, bottom = x_train[:, :32].sum(axis=1), x_train[:, 32:].sum(axis=1)
    words = [f"ink{int(v // 2)}" for v in top]
    return words, (bottom > top).astype("int64")


def lookup_table(training, in_build: bool = False) -> Program:
    """TensorFlow's parameter-server guide's shape: a StringLookup made in the strategy's scope and
    used in the input pipeline, an Embedding over its ids, a partitioner for the embedding."""
    words, labels = _words()
    vocabulary = sorted(set(words))
    made: dict[str, keras.layers.Layer] = {}

    def setup() -> None:
        made["lookup"] = keras.layers.StringLookup(vocabulary=vocabulary, mask_token=None)

    if in_build:  # the mistake: made before the cluster is joined
        setup()

    def ids(word, label):
        return made["lookup"](word), label

    def model() -> keras.Model:
        return keras.Sequential(
            [
                keras.Input((), dtype="int64"),
                keras.layers.Embedding(len(vocabulary) + 1, 64),
                keras.layers.Dense(2),
            ]
        )

    def train_data(shard: Shard) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((words, labels)).shard(shard.count, shard.index).map(ids)

    def eval_data() -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((words[:300], labels[:300])).map(ids)

    return Program(
        build_model=model,
        train_data=train_data,
        eval_data=eval_data,
        setup=None if in_build else setup,
        variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=1024, max_shards=2
        ),
    )


def lookup_table_in_build(training) -> Program:
    return lookup_table(training, in_build=True)
