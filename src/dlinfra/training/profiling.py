"""`dlinfra profile`: one worker's step, measured in one process on this machine.

The sizing advisor needs the compute time of a step on a device; the links it takes from the
catalog. A built-in model is fed random examples of the spec's shape (a step's arithmetic does not
depend on the values, and no dataset is fetched); a program trains on its own first batch.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from dlinfra.spec.training import TrainingSpec
from dlinfra.training import objective as objectives
from dlinfra.training.program import Program, Shard

WARMUP_STEPS = 3  # the first calls trace and compile


@dataclass(frozen=True)
class StepProfile:
    parameters: int
    trainable: int
    step_seconds: float  # the median of the timed steps
    steps: int
    # a step's gradient: an embedding's holds only the rows the batch looked up (sparse)
    gradient_elements: int
    # what a step moves of each variable, in the order the model made them (the ps placement's);
    # empty where the program splits variables itself (Program.variable_partitioner)
    variables: tuple[int, ...]


def random_program(training: TrainingSpec, shape: tuple[int, ...], classes: int) -> Program:
    """The built-in model on random examples of its input: its step without its data."""
    from dlinfra.training import models

    def examples(shard: Shard) -> Any:
        import tensorflow as tf

        features = tf.random.stateless_uniform([training.batch_size, *shape], seed=[1, 2])
        labels = tf.random.stateless_uniform(
            [training.batch_size], seed=[3, 4], maxval=classes, dtype=tf.int64
        )
        return tf.data.Dataset.from_tensor_slices((features, labels))

    return Program(
        build_model=lambda: models.build(training.model, shape, classes),
        train_data=examples,
        eval_data=lambda: examples(Shard(0, 1)),
    )


def measure(program: Program, training: TrainingSpec, seconds: float = 5.0, most: int = 2000) -> StepProfile:
    """Steps on one batch for about `seconds` after the warm-up (at least 10, at most `most`)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from dlinfra.training.loop import make_optimizer

    if training.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    model = program.build_model()
    objective = objectives.resolve(program, model)
    optimizer, _ = objectives.optimizer(
        program, model, lambda: make_optimizer(training.optimizer, training.learning_rate)
    )
    # (x, y) or (x, y, sample_weight)
    features, labels, *weights = next(
        iter(program.train_data(Shard(0, 1)).batch(training.batch_size).take(1))
    )

    @tf.function(jit_compile=training.jit_compile)
    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(objective.values(labels, model(features, training=True), *weights))
        optimizer.apply_gradients(
            zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables, strict=True)
        )
        return loss

    for _ in range(WARMUP_STEPS):
        step().numpy()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < most and (len(times) < 10 or time.perf_counter() < deadline):
        began = time.perf_counter()
        step().numpy()  # waits for the device
        times.append(time.perf_counter() - began)
    count = sum(int(np.prod(w.shape)) for w in model.weights if "optimizer" not in w.path)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(objective.values(labels, model(features, training=True), *weights))
    gradients = tape.gradient(loss, model.trainable_variables)
    sparse = {
        id(v): int(np.prod(g.values.shape))
        for v, g in zip(model.trainable_variables, gradients, strict=True)
        if isinstance(g, tf.IndexedSlices)
    }
    moved = [sparse.get(id(w), int(np.prod(w.shape))) for w in model.weights if "optimizer" not in w.path]
    trained = sum(sparse.get(id(v), int(np.prod(v.shape))) for v in model.trainable_variables)
    placed = () if program.variable_partitioner is not None else tuple(moved)
    return StepProfile(count, trainable, statistics.median(times), len(times), trained, placed)
