"""Adapted from TensorFlow's guide "Custom training loop with Keras and MultiWorkerMirroredStrategy"
(the guide itself, as published, is tests/data/guides/custom_loop): the same loop, per-worker
checkpoints and restore, made resumable and observable for the restart tests. Its changes: one file;
flags for the data (a local 8x8 digits .npz instead of MNIST's download), the checkpoint directory
(the guide's is a temporary one its process removes), epochs and steps per epoch; a seeded shuffle,
the shard before it and a repeat (1,400 digits would run out); smaller layers without the L2
regularizers; Keras 3's `reduction=None` and `reset_state()`; a "restored ... at epoch" line; it
divides by max(num_batches, 1) (the guide saves its checkpoint before it moves on to the next epoch,
so resumed from it, its first epoch runs no batch and divides by zero); and it calls dlinfra.report
each step when asked to (--report)."""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--checkpoint_dir", default="/tmp/ckpt")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps_per_epoch", type=int, default=20)
parser.add_argument("--report", action="store_true")
args = parser.parse_args()

per_worker_batch_size = 32
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
global_batch_size = per_worker_batch_size * num_workers


def dataset_fn(input_context):
    with np.load(args.data) as data:
        x, y = data["x_train"].astype("float32") / 16.0, data["y_train"].astype("int64")
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.shuffle(len(x), seed=1).repeat().batch(batch_size)


def build_cnn_model():
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(8, 8)),
            tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )


def _is_chief(task_type, task_id, cluster_spec):
    return (
        task_type is None
        or task_type == "chief"
        or (task_type == "worker" and task_id == 0 and "chief" not in cluster_spec.as_dict())
    )


def _get_temp_dir(dirpath, task_id):
    temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


strategy = tf.distribute.MultiWorkerMirroredStrategy()

with strategy.scope():
    multi_worker_dataset = strategy.distribute_datasets_from_function(dataset_fn)
    multi_worker_model = build_cnn_model()
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = multi_worker_model(x, training=True)
            per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=None
            )(y, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss)
        grads = tape.gradient(loss, multi_worker_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
        train_accuracy.update_state(y, predictions)
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="step_in_epoch")
task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
cluster_spec = strategy.cluster_resolver.cluster_spec()

checkpoint = tf.train.Checkpoint(model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)
write_checkpoint_dir = write_filepath(args.checkpoint_dir, task_type, task_id, cluster_spec)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)
latest_checkpoint = tf.train.latest_checkpoint(args.checkpoint_dir)
if latest_checkpoint:
    checkpoint.restore(latest_checkpoint)
    print(f"restored {latest_checkpoint} at epoch {int(epoch.numpy())}", flush=True)

while epoch.numpy() < args.epochs:
    iterator = iter(multi_worker_dataset)
    total_loss = 0.0
    num_batches = 0
    while step_in_epoch.numpy() < args.steps_per_epoch:
        total_loss += train_step(iterator)
        num_batches += 1
        step_in_epoch.assign_add(1)
        if args.report:
            import dlinfra

            dlinfra.report(
                int(epoch.numpy()) * args.steps_per_epoch + int(step_in_epoch.numpy()),
                loss=total_loss / num_batches,
                train_accuracy=train_accuracy.result(),
            )
    train_loss = total_loss / max(num_batches, 1)
    print(
        "Epoch: %d, accuracy: %f, train_loss: %f." % (epoch.numpy(), train_accuracy.result(), train_loss),
        flush=True,
    )
    train_accuracy.reset_state()
    checkpoint_manager.save()
    if not _is_chief(task_type, task_id, cluster_spec):
        tf.io.gfile.rmtree(write_checkpoint_dir)
    epoch.assign_add(1)
    step_in_epoch.assign(0)
