"""A hand-written parameter-server program, for bench_script_mode: TF_CONFIG names the cluster,
workers and parameter servers serve, the chief schedules calls of --steps_per_call steps through a
ClusterCoordinator and prints the examples/s it measured after a warm-up. It reports its progress
with dlinfra.report when dlinfra is importable (a no-op outside a dlinfra run)."""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--calls", type=int, default=60)
parser.add_argument("--warmup_calls", type=int, default=10)
parser.add_argument("--steps_per_call", type=int, default=10)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--model_dir", default="")
args = parser.parse_args()

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("worker", "ps"):
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id, start=True
    )
    server.join()

try:
    from dlinfra import report
except ImportError:

    def report(step, **scalars):
        pass


strategy = tf.distribute.ParameterServerStrategy(resolver)
rng = np.random.default_rng(0)
x = rng.normal(size=(4096, 8, 8, 1)).astype("float32")
y = rng.integers(0, 10, size=4096).astype("int64")

with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(8, 8, 1)),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    optimizer = tf.keras.optimizers.Adam(0.001)


def dataset_fn(_):
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch)


@tf.function
def call_fn(iterator):
    def replica_fn(features, labels):
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    loss = tf.constant(0.0)
    for _ in tf.range(args.steps_per_call):
        features, labels = next(iterator)
        loss = strategy.run(replica_fn, args=(features, labels))
    return loss


coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
iterator = iter(
    coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(dataset_fn))
)
for _ in range(args.warmup_calls):
    coordinator.schedule(call_fn, args=(iterator,))
coordinator.join()
started = time.perf_counter()
for call in range(1, args.calls + 1):
    loss = coordinator.schedule(call_fn, args=(iterator,))
    if call % 10 == 0:
        coordinator.join()
        report(call * args.steps_per_call, loss=loss.fetch())
coordinator.join()
seconds = time.perf_counter() - started
examples = args.calls * args.steps_per_call * args.batch
print("RESULT " + json.dumps({"examples_per_sec": examples / seconds, "seconds": seconds}), flush=True)
if args.model_dir:
    model.save(os.path.join(args.model_dir, "model.keras"))
