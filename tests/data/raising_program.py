"""A user program whose model trips over bad data at step 5 on worker 1 only, mid-training (not while
building): the fail-fast path. Writes the time it raised to $RAISE_AT_FILE for the test to time."""

from __future__ import annotations

import json
import os
import time

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from dlinfra.training import Program, Shard

FAIL_AT_STEP = 5


class Inspect(keras.layers.Layer):
    """Passes its input through; on worker 1 the fifth training batch is 'bad'."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0
        self.task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})

    def _check(self, x):
        self.calls += 1
        if self.task == {"type": "worker", "index": 1} and self.calls == FAIL_AT_STEP:
            with open(os.environ["RAISE_AT_FILE"], "w") as fh:
                fh.write(str(time.time()))
            raise ValueError(f"bad record at step {FAIL_AT_STEP}: pixel values out of range")
        return x

    def call(self, x, training=False):
        if not training:
            return x
        y = tf.py_function(self._check, [x], x.dtype)
        y.set_shape(x.shape)
        return y


def _daemonize_on_worker_1() -> None:
    """Issue 55, class 4: a Program's code that leaves a daemon (fork, setsid, fork) behind; its pid
    goes beside $RAISE_AT_FILE. The node's beacon must end it with the run."""
    if json.loads(os.environ.get("TF_CONFIG", "{}")).get("task") != {"type": "worker", "index": 1}:
        return
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.environ["RAISE_AT_FILE"] + ".daemon", "w") as fh:
                fh.write(str(os.getpid()))
            os.execvp("python", ["python", "-c", "import time; time.sleep(600)", "daemon-of-a-program"])
        os._exit(0)
    os.wait()


def program(training):
    _daemonize_on_worker_1()
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")

    def model() -> keras.Model:
        return keras.Sequential(
            [keras.Input((64,)), Inspect(), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)]
        )

    def train_data(shard: Shard) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((x[:1500], y[:1500])).shard(shard.count, shard.index)

    def eval_data() -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((x[1500:], y[1500:]))

    assert np.isfinite(x).all()
    return Program(build_model=model, train_data=train_data, eval_data=eval_data)
