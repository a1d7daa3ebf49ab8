"""The parameter-server step count: a remote call adds its steps to the count on the ps once they
have run, so a call lost mid-way (and re-run by TensorFlow elsewhere) is not counted twice. Traced
here under the default strategy: the ordering is the step function's, whatever runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from dlinfra.contract import WORKER_INDEX_FILE
from dlinfra.training.meter import InputClock
from dlinfra.training.objective import resolve
from dlinfra.training.parameter_servers import counted_steps
from dlinfra.training.program import Program


def _ancestors(op: Any) -> set[str]:
    """The types of every op `op` waits for, through data and control edges."""
    seen: dict[str, Any] = {}
    todo = [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent.name not in seen:
                seen[parent.name] = parent
                todo.append(parent)
    return {parent.type for parent in seen.values()}


def test_a_call_counts_its_steps_after_running_them(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a worker's cwd, its work dir, where it keeps its index
    Path(WORKER_INDEX_FILE).write_text("1")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    applied = tf.Variable(5, dtype=tf.int64)  # as restored from a checkpoint
    goal = resolve(Program(lambda: model, lambda shard: None, lambda: None), model)
    tally = tf.Variable(tf.zeros([2, 2], tf.float64))
    steps = counted_steps(tf.distribute.get_strategy(), model, optimizer, goal, applied, tally, InputClock())
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 3, size=16))
    batches = iter(tf.data.Dataset.from_tensor_slices(data).batch(4).repeat())

    loss, count, waited, busy = steps(batches, tf.constant(3)).numpy()
    assert (count, int(applied.numpy()), int(optimizer.iterations.numpy())) == (8, 8, 3)
    assert np.isfinite(loss) and loss > 0
    assert 0 <= waited <= busy, "the input wait is a part of the call's time"
    assert tally.numpy().tolist() == [[0, 0], [3, busy]], "its worker's row: its steps and seconds"

    graph = steps.get_concrete_function(batches, tf.constant(3)).graph
    counts = [op for op in graph.get_operations() if op.type == "AssignAddVariableOp"]
    assert len(counts) == 1, [op.name for op in counts]  # the optimizer's updates are in the loop body
    assert "While" in _ancestors(counts[0]), "the count may run before the call's steps"


PS_STEP_TRACES = """
import glob, sys, tempfile
import keras, numpy as np, tensorflow as tf
from dlinfra.training.meter import InputClock
from dlinfra.training.objective import resolve
from dlinfra.training.parameter_servers import counted_steps
from dlinfra.training.program import Program

def own_loss(labels, outputs):  # Python control flow on a tensor: only a converted function can trace it
    per_example = keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
    if tf.reduce_mean(per_example) > 1e6:
        per_example = per_example * 0.0
    return per_example

def trace(loss, out):
    tempfile.tempdir = out  # where AutoGraph writes each function it converts
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    goal = resolve(Program(lambda: model, lambda shard: None, lambda: None, loss=loss), model)
    tally = tf.Variable(tf.zeros([1, 2], tf.float64))
    applied = tf.Variable(0, dtype=tf.int64)
    steps = counted_steps(tf.distribute.get_strategy(), model, optimizer, goal, applied, tally, InputClock())
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 3, size=16))
    batches = iter(tf.data.Dataset.from_tensor_slices(data).batch(4).repeat())
    loss, count, _, _ = steps(batches, tf.constant(3))
    converted = sorted(glob.glob(f"{out}/__autograph_generated_file*"))
    print(out, int(count), bool(np.isfinite(loss)), len(converted))

trace(None, sys.argv[1])  # the default loss, a Keras loss object
trace(own_loss, sys.argv[2])
"""


def test_autograph_converts_a_programs_own_loss_and_none_of_the_loop(tmp_path, monkeypatch) -> None:
    """AutoGraph's conversions were most of the first trace (training.tracing): under a Keras loss
    nothing of the step function is converted, and a loss callable of the program's own, whose `if`
    on a tensor only a conversion can trace, still trains. In a process of its own, from a file:
    AutoGraph caches its conversions per process, and reads the source it converts."""
    monkeypatch.chdir(tmp_path)
    Path(WORKER_INDEX_FILE).write_text("0")
    (tmp_path / "traces.py").write_text(PS_STEP_TRACES)
    keras_loss, own_loss = tmp_path / "keras_loss", tmp_path / "own_loss"
    keras_loss.mkdir()
    own_loss.mkdir()
    done = subprocess.run(
        [sys.executable, "traces.py", str(keras_loss), str(own_loss)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()[-2:]
    assert lines[0] == f"{keras_loss} 3 True 0", lines  # trained, and nothing converted
    out, count, finite, converted = lines[1].split()
    assert (out, count, finite) == (str(own_loss), "3", "True"), lines
    assert int(converted) >= 2, "the step function and the program's loss are converted"
