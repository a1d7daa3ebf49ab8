"""A user's own script over a packed data set (`dlinfra data pack digits`): it finds its node's
shards by the patterns dlinfra gives it, `$DLINFRA_TRAIN_FILES` and `$DLINFRA_EVAL_FILES`, and
parses them with TensorFlow ops of its own. Every node writes down the files and example ids it
read; worker 0, which owns the result, trains a small Keras model on its share and evaluates it on
the eval shards (the data plumbing of a script, not a distributed algorithm)."""

import json
import os

import keras
import tensorflow as tf

FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "id": tf.io.FixedLenFeature([], tf.int64),
}


def parse(raw):
    ex = tf.io.parse_single_example(raw, FEATURES)
    image = tf.cast(tf.io.decode_png(ex["image"], channels=1), tf.float32) / 255.0
    return tf.ensure_shape(image, (8, 8, 1)), ex["label"], ex["id"]


def read(pattern):
    files = sorted(tf.io.gfile.glob(pattern))
    return files, tf.data.TFRecordDataset(files).map(parse)


task = json.loads(os.environ["TF_CONFIG"])["task"]
files, train = read(os.environ["DLINFRA_TRAIN_FILES"])
ids = [int(i) for _, _, i in train.as_numpy_iterator()]
seen = {"node": os.environ["DLINFRA_NODE"], "files": [os.path.basename(f) for f in files], "ids": ids}
with open(os.path.join(os.environ["DLINFRA_DATA_DIR"], "read.json"), "w") as out:
    json.dump(seen, out)

if task["type"] == "worker" and task["index"] == 0:
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(train.map(lambda x, y, i: (x, y)).shuffle(1024).batch(32), epochs=20, verbose=2)
    _, held = read(os.environ["DLINFRA_EVAL_FILES"])
    _, accuracy = model.evaluate(held.map(lambda x, y, i: (x, y)).batch(256), verbose=0)
    print(f"eval accuracy {accuracy:.4f}")
    model.save(os.path.join(os.environ["DLINFRA_MODEL_DIR"], "model.keras"))
