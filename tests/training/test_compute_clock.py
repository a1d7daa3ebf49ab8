"""A mirrored worker's own compute, timed inside its steps by the loop's own replica step
(training.loop.timed_replica_step): from its batch to its gradients, with the gradients made by a
nested tf.function of stateless ops, as the loop's are. The pass is a chain of matrix products that
is nearly all of the step, so its share of the step's wall time, timed right, is near one, and timed
at the nested call's side effects, near zero: apart by far more than any load on this machine can
blur (both are shares of one call)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import keras
import pytest
import tensorflow as tf

from dlinfra.training.loop import timed_replica_step
from dlinfra.training.meter import Computed, InputClock

SIDE = 384  # of the square matrices: eight products and their gradients are milliseconds each


class ControlOnly(Computed):
    """The tensors as they are: a timestamp then only control-depends on them (what the loop first
    did, and what Computed exists to replace)."""

    def __call__(self, *tensors: Any) -> list[Any]:
        return [t for t in tf.nest.flatten(tensors, expand_composites=True) if t is not None]


def _share_timed(done: Computed, steps: int = 6) -> float:
    """The compute the replica step timed, per step, over the wall time per step."""
    layer = keras.layers.Dense(SIDE, use_bias=False, kernel_initializer=keras.initializers.Identity(0.5))
    layer.build((None, SIDE))
    optimizer = keras.optimizers.SGD(0.0)
    optimizer.build(layer.trainable_variables)

    @tf.function
    def gradients(x: Any) -> Any:  # a nested function of stateless ops: inlined into the step's graph
        with tf.GradientTape() as tape:
            for _ in range(8):
                x = tf.tanh(x @ layer.kernel)
            loss = tf.reduce_sum(x)
        return loss, tape.gradient(loss, layer.trainable_variables)

    model = SimpleNamespace(trainable_variables=layer.trainable_variables)
    step = timed_replica_step(model, optimizer, gradients, InputClock(), done)

    @tf.function
    def train_steps(n: Any) -> Any:
        own = tf.constant(0.0, tf.float64)
        for _ in tf.range(n):
            _, seconds = step(tf.ones((SIDE, SIDE)))
            own += seconds
        return own / tf.cast(n, tf.float64)

    train_steps(tf.constant(1))  # traced
    start = time.perf_counter()
    timed = float(train_steps(tf.constant(steps)))
    return timed / ((time.perf_counter() - start) / steps)


@pytest.mark.parametrize("host", [False, True], ids=["cpu", "host-copy-as-on-a-gpu"])
def test_a_workers_compute_is_timed_to_its_gradients_not_to_the_nested_calls_side_effects(host: bool) -> None:
    """`host` is the path a GPU worker takes (one element of each tensor brought to the host): here
    on a CPU, it stands in for a GPU, which this machine has not; it must time the same pass."""
    share = _share_timed(Computed(host=host))
    assert 0.5 < share <= 1.0, share


def test_a_control_dependency_on_a_nested_calls_outputs_times_nothing() -> None:
    """Why Computed exists: TensorFlow's inliner turns a control dependency on a nested function's
    outputs into one on its side effects, done before its pass runs (measured: 0.05 ms of 22)."""
    share = _share_timed(ControlOnly())
    assert share < 0.1, share
