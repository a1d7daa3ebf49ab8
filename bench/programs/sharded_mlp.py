"""An MLP whose variables dominate its compute (1.1 M parameters, 4.5 MB), for bench_sizing: its
program splits each big variable into 512 KB shards (Program.variable_partitioner), so parameter
servers share its bytes evenly, as the sizing advisor assumes of a partitioned model. Without it
TensorFlow places each variable whole, in turn: the 4 MB middle kernel would load one ps however
many there are (the advisor models that too, and says so)."""

import keras
import numpy as np
import tensorflow as tf

from dlinfra.training.program import Program

FEATURES, CLASSES, EXAMPLES = 64, 10, 4096


def program(training):
    rng = np.random.default_rng(training.seed)
    x = rng.standard_normal((EXAMPLES, FEATURES)).astype("float32")
    y = np.argmax(x @ rng.standard_normal((FEATURES, CLASSES)), axis=1).astype("int64")

    def train_data(shard):
        return tf.data.Dataset.from_tensor_slices(
            (x[shard.index :: shard.count], y[shard.index :: shard.count])
        )

    def model():
        inputs = keras.Input(shape=(FEATURES,))
        hidden = keras.layers.Dense(1024, activation="relu")(inputs)
        hidden = keras.layers.Dense(1024, activation="relu")(hidden)
        return keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))

    return Program(
        build_model=model,
        train_data=train_data,
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x[:512], y[:512])),
        variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=512 << 10, max_shards=8
        ),
    )
