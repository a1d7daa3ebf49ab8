"""A user training program: the same file trains on one process or N nodes with no change."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from dlinfra.training import Program, Shard


def build(training):
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]

    def model() -> keras.Model:
        return keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
        )

    def train_data(shard: Shard) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shard(shard.count, shard.index)

    def eval_data() -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((x_test, y_test))

    assert np.isfinite(x).all()
    return Program(build_model=model, train_data=train_data, eval_data=eval_data)
