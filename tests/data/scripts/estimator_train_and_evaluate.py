"""An Estimator program, as TensorFlow 1.x and 2.x up to 2.15 taught it: a canned DNNClassifier,
`tf.estimator.train_and_evaluate` reading its cluster (chief, workers, parameter servers) from
TF_CONFIG, checkpoints in --model_dir (a shared path: each parameter server writes its shards of a
save there), and the chief exporting a SavedModel at the end. It runs on TensorFlow 2.15, the last
release with tf.estimator, whatever TensorFlow dlinfra itself uses."""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--model_dir", required=True)
parser.add_argument("--export_dir", required=True)
parser.add_argument("--steps", type=int, default=600)
args = parser.parse_args()

with np.load(args.data) as d:
    x_train = d["x_train"].reshape(-1, 64).astype("float32") / 16.0
    y_train = d["y_train"].astype("int32")
    x_test = d["x_test"].reshape(-1, 64).astype("float32") / 16.0
    y_test = d["y_test"].astype("int32")


def input_fn(x, y, training):
    ds = tf.data.Dataset.from_tensor_slices(({"pixels": x}, y))
    if training:
        ds = ds.shuffle(len(x)).repeat()
    return ds.batch(32)


feature_columns = [tf.feature_column.numeric_column("pixels", shape=(64,))]
estimator = tf.estimator.DNNClassifier(
    hidden_units=[64, 32],
    feature_columns=feature_columns,
    n_classes=10,
    optimizer="Adam",
    model_dir=args.model_dir,
    config=tf.estimator.RunConfig(save_checkpoints_steps=200, log_step_count_steps=100),
)
train_spec = tf.estimator.TrainSpec(input_fn=lambda: input_fn(x_train, y_train, True), max_steps=args.steps)
eval_spec = tf.estimator.EvalSpec(input_fn=lambda: input_fn(x_test, y_test, False), steps=None)
tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)

task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
if task.get("type", "chief") == "chief":
    print("eval:", estimator.evaluate(lambda: input_fn(x_test, y_test, False)), flush=True)

    def serving_input_fn():
        pixels = tf.compat.v1.placeholder(tf.float32, [None, 64], name="pixels")
        return tf.estimator.export.ServingInputReceiver({"pixels": pixels}, {"pixels": pixels})

    print("exported", estimator.export_saved_model(args.export_dir, serving_input_fn), flush=True)
