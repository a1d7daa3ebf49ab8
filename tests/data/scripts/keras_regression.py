"""A typical Keras regression, as a tutorial writes it: scikit-learn's diabetes data (it ships with
the package), a normalization layer adapted to the training features, a small MLP, `compile` with
mean squared error and a mean absolute error metric, `fit` with a TensorBoard callback, the model
saved. No strategy, no TF_CONFIG: a one-machine program."""

import argparse
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_diabetes

parser = argparse.ArgumentParser()
parser.add_argument("--model_dir", default="/tmp/model")
parser.add_argument("--tensorboard_dir", default="/tmp/logs")
parser.add_argument("--epochs", type=int, default=60)
args = parser.parse_args()

x, y = load_diabetes(return_X_y=True)
x, y = x.astype("float32"), y.astype("float32")
rng = np.random.default_rng(0)
order = rng.permutation(len(x))
train, test = order[:350], order[350:]

normalizer = tf.keras.layers.Normalization()
normalizer.adapt(x[train])
model = tf.keras.Sequential(
    [
        tf.keras.Input(shape=(10,)),
        normalizer,
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(1),
    ]
)
model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
model.fit(
    x[train],
    y[train],
    validation_data=(x[test], y[test]),
    epochs=args.epochs,
    batch_size=32,
    verbose=2,
    callbacks=[tf.keras.callbacks.TensorBoard(log_dir=args.tensorboard_dir)],
)
model.save(os.path.join(args.model_dir, "model.keras"))
