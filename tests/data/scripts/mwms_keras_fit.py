"""Adapted from TensorFlow's guide "Multi-worker training with Keras" (as published:
tests/data/guides/keras_fit): `model.fit` under MultiWorkerMirroredStrategy with tf-keras
(TF_USE_LEGACY_KERAS=1; Keras 3's fit fails under the strategy, keras#20585), the cluster from
TF_CONFIG. Its changes: one file; flags for the data (a local 8x8 digits .npz instead of MNIST's
download), a BackupAndRestore directory (the guide's notebook-only fault-tolerance cells) and a
TensorBoard directory (a callback the guide does not have: its scalars are this script's progress,
which it reports nothing else of); smaller layers, batch 32, learning rate 0.05, 40 steps an epoch.
Like the guide's main.py, it saves no model."""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--backup_dir", default="/tmp/backup")
parser.add_argument("--tensorboard_dir", default="/tmp/logs")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()


def mnist_dataset(batch_size):
    with np.load(args.data) as d:
        x_train, y_train = d["x_train"].astype("float32") / 16.0, d["y_train"].astype("int64")
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1400).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(8, 8)),
            tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
        metrics=["accuracy"],
    )
    return model


per_worker_batch_size = 32
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()

callbacks = [
    tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir),
    tf.keras.callbacks.TensorBoard(log_dir=args.tensorboard_dir),
]
multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs, steps_per_epoch=40, callbacks=callbacks)
