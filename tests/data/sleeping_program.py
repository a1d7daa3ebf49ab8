"""A user program whose input pipeline, some 250 steps in, sleeps forever inside a training step:
every process stays alive and no step completes (a stalled run, not a crashed or frozen one)."""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from dlinfra.training import Program, Shard

STALL_AFTER = 20_000  # examples: past the 4096 the shuffle buffer takes, then 64 a step


def sleep_forever() -> None:
    while True:
        time.sleep(1)


def program(training):
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")

    def examples():
        for i in range(10**9):
            if i == STALL_AFTER:
                sleep_forever()
            yield x[i % 1500], y[i % 1500]

    def model() -> keras.Model:
        return keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)]
        )

    def train_data(shard: Shard) -> tf.data.Dataset:
        spec = (tf.TensorSpec((64,), tf.float32), tf.TensorSpec((), tf.int64))
        return tf.data.Dataset.from_generator(examples, output_signature=spec)

    def eval_data() -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((x[1500:], y[1500:]))

    assert np.isfinite(x).all()
    return Program(build_model=model, train_data=train_data, eval_data=eval_data)
