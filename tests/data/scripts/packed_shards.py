"""A user's own MultiWorkerMirroredStrategy script over a packed data set (`dlinfra data pack
digits`): each worker finds its own shards by the pattern dlinfra gives it, `$DLINFRA_TRAIN_FILES`,
parses them with TensorFlow ops of its own and feeds them to a custom training loop; worker 0, the
chief, evaluates on `$DLINFRA_EVAL_FILES` and saves the model. Every worker also writes down the files
and example ids its pattern named, for the test to check the shares."""

import json
import os

import tensorflow as tf

FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "id": tf.io.FixedLenFeature([], tf.int64),
}
STEPS = 150
BATCH = 32  # per worker


def parse(raw):
    ex = tf.io.parse_single_example(raw, FEATURES)
    image = tf.cast(tf.io.decode_png(ex["image"], channels=1), tf.float32) / 255.0
    return tf.ensure_shape(image, (8, 8, 1)), ex["label"], ex["id"]


def examples(pattern):
    return tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(pattern))).map(parse)


strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]
is_chief = task["type"] == "worker" and task["index"] == 0

files = sorted(os.path.basename(f) for f in tf.io.gfile.glob(os.environ["DLINFRA_TRAIN_FILES"]))
ids = [int(i) for _, _, i in examples(os.environ["DLINFRA_TRAIN_FILES"]).as_numpy_iterator()]
with open(os.path.join(os.environ["DLINFRA_DATA_DIR"], "read.json"), "w") as out:
    json.dump({"files": files, "ids": ids}, out)


def dataset_fn(context):
    # the worker's files are its share already: no further sharding
    pairs = examples(os.environ["DLINFRA_TRAIN_FILES"]).map(lambda x, y, i: (x, y))
    return (
        pairs.shuffle(1024)
        .repeat()
        .batch(context.get_per_replica_batch_size(BATCH * context.num_input_pipelines))
    )


with strategy.scope():
    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((8, 8, 1)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    optimizer = tf.keras.optimizers.Adam(0.01)


@tf.function
def train_step(iterator):
    def step(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=True), from_logits=True
            )
            loss = tf.nn.compute_average_loss(per_example)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return strategy.reduce("SUM", strategy.run(step, args=next(iterator)), axis=None)


iterator = iter(dataset)
for _ in range(STEPS):
    loss = train_step(iterator)
print(f"step {STEPS} loss {float(loss):.4f}", flush=True)

model_dir = (
    os.environ["DLINFRA_MODEL_DIR"] if is_chief else os.path.join(os.environ["DLINFRA_DATA_DIR"], "model")
)
os.makedirs(model_dir, exist_ok=True)
model.save(
    os.path.join(model_dir, "model.keras")
)  # every worker saves (the guide's pattern); the chief's is kept
if is_chief:
    held = examples(os.environ["DLINFRA_EVAL_FILES"]).map(lambda x, y, i: (x, y)).batch(256)
    right = total = 0
    for x, y in held:
        right += int(tf.reduce_sum(tf.cast(tf.argmax(model(x), axis=1) == y, tf.int32)))
        total += int(tf.size(y))
    print(f"eval accuracy {right / total:.4f}", flush=True)
