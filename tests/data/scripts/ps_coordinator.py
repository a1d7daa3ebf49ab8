"""Adapted from TensorFlow's guide "Parameter server training with ParameterServerStrategy" (as
published: tests/data/guides/parameter_server), its custom training loop as a user runs it on a real
cluster: TF_CONFIG names the cluster, workers and parameter servers start a tf.distribute.Server and
join it, the chief coordinates. StringLookup and Embedding features, a variable partitioner over the
parameter servers, a ClusterCoordinator scheduling steps. Its changes: written for Keras 3 (no legacy
optimizer, no TF op on a symbolic tensor), so the lookups are applied in the dataset instead of
through the guide's two preprocessing models and the model's input is named `features`; --epochs
and --steps_per_epoch flags; the guide's shard asserts and evaluation cells left out. Like the guide,
it saves no model and writes no checkpoint."""

import argparse
import os
import random

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps_per_epoch", type=int, default=5)
args = parser.parse_args()

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if cluster_resolver.task_type in ("worker", "ps"):
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    server = tf.distribute.Server(
        cluster_resolver.cluster_spec(),
        job_name=cluster_resolver.task_type,
        task_index=cluster_resolver.task_id,
        protocol=cluster_resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()

NUM_PS = len(cluster_resolver.cluster_spec().as_dict().get("ps", []))
variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=(256 << 10), max_shards=NUM_PS
)
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=variable_partitioner)

feature_vocab = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]
label_vocab = ["yes", "no"]

with strategy.scope():
    feature_lookup_layer = tf.keras.layers.StringLookup(vocabulary=feature_vocab, mask_token=None)
    label_lookup_layer = tf.keras.layers.StringLookup(
        vocabulary=label_vocab, num_oov_indices=0, mask_token=None
    )


def feature_and_label_gen(num_examples=200):
    examples = {"features": [], "label": []}
    for _ in range(num_examples):
        features = random.sample(feature_vocab, 3)
        label = ["yes"] if "avenger" in features else ["no"]
        examples["features"].append(features)
        examples["label"].append(label)
    return examples


examples = feature_and_label_gen()


def dataset_fn(_):
    raw_dataset = tf.data.Dataset.from_tensor_slices(examples)
    train_dataset = (
        raw_dataset.map(
            lambda x: (
                {"features": feature_lookup_layer(x["features"])},
                label_lookup_layer(x["label"]),
            )
        )
        .shuffle(200)
        .batch(32)
        .repeat()
    )
    return train_dataset


with strategy.scope():
    model_input = tf.keras.layers.Input(shape=(3,), dtype="int64", name="features")
    emb_layer = tf.keras.layers.Embedding(
        input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384
    )
    emb_output = tf.keras.layers.GlobalAveragePooling1D()(emb_layer(model_input))
    dense_output = tf.keras.layers.Dense(
        units=1, activation="sigmoid", kernel_regularizer=tf.keras.regularizers.L2(1e-4)
    )(emb_output)
    model = tf.keras.Model({"features": model_input}, dense_output)
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.1)
    accuracy = tf.keras.metrics.Accuracy()


@tf.function
def step_fn(iterator):
    def replica_fn(batch_data, labels):
        with tf.GradientTape() as tape:
            pred = model(batch_data, training=True)
            per_example_loss = tf.keras.losses.BinaryCrossentropy(reduction="none")(labels, pred)
            loss = tf.nn.compute_average_loss(per_example_loss)
            model_losses = model.losses
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
        accuracy.update_state(labels, actual_pred)
        return loss

    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)


@tf.function
def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)


per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)

for i in range(args.epochs):
    accuracy.reset_state()
    for _ in range(args.steps_per_epoch):
        coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    print("Finished epoch %d, accuracy is %f." % (i, accuracy.result().numpy()), flush=True)

loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
print("Final loss is %f" % loss.fetch(), flush=True)
