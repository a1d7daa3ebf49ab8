"""A small MultiWorkerMirroredStrategy training loop that reports its step every ~2 s, until worker 1
hangs in its own code (time.sleep, as a stuck input or a forgotten lock would): worker 0 then waits
for it in the next step's all-reduce. The stall verdict must name worker 1, the one that hung."""

import argparse
import time

import numpy as np
import tensorflow as tf

import dlinfra

parser = argparse.ArgumentParser()
parser.add_argument("--hang-at", type=int, default=8, help="the step after which worker 1 hangs")
parser.add_argument("--every", type=float, default=2.0, help="seconds between steps (and reports)")
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.1)
batches = iter(strategy.experimental_distribute_dataset(data))


@tf.function
def train_step(batch):
    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features, training=True) - labels))
        optimizer.apply_gradients(
            zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        )
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step_fn, args=(batch,)), axis=None)


def wait_for_something_that_never_comes():
    while True:
        time.sleep(3600)


is_worker_1 = strategy.cluster_resolver.task_id == 1
step = 0
while True:
    loss = float(train_step(next(batches)))
    step += 1
    dlinfra.report(step, loss=loss)
    if is_worker_1 and step == args.hang_at:
        print(f"worker 1 hangs after step {step}", flush=True)
        wait_for_something_that_never_comes()
    time.sleep(args.every)
