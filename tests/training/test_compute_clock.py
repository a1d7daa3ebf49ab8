"""A mirrored worker's own compute, timed inside its steps the way training.loop times it: from its
batch to its gradients, with the gradients made by a nested tf.function of stateless ops as the
loop's are. The pass is a chain of matrix products that is nearly all of the step, so its share of
the step's wall time, timed right, is near one, and timed at the nested call's side effects, near
zero: apart by far more than any load on this machine can blur (both are shares of one call)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import tensorflow as tf

from dlinfra.training.meter import Computed, InputClock

SIDE = 384  # of the square matrices: eight products and their gradients are milliseconds each


def _share_timed(done: Computed | None, steps: int = 6) -> float:
    """The compute timed per step over the wall time per step; `done` None: the timestamp only
    control-depends on the nested function's outputs (what the loop first did, and what Computed
    exists to replace)."""
    clock = InputClock()
    weight = tf.Variable(tf.eye(SIDE) * 0.5)

    @tf.function
    def gradients(x: Any) -> Any:  # a nested function of stateless ops: inlined into the step's graph
        with tf.GradientTape() as tape:
            for _ in range(8):
                x = tf.tanh(x @ weight)
            loss = tf.reduce_sum(x)
        return loss, tape.gradient(loss, [weight])

    @tf.function
    def train_steps(n: Any) -> Any:
        own = tf.constant(0.0, tf.float64)
        for _ in tf.range(n):
            x = tf.ones((SIDE, SIDE))
            if done is None:
                with tf.control_dependencies([x]):
                    began = clock.now()
                with tf.control_dependencies([began]):
                    x = tf.identity(x)
                loss, grads = gradients(x)
                seconds = clock.since(began, (loss, grads))
            else:
                began = clock.after(done(x, weight))
                with tf.control_dependencies([began]):
                    x = tf.identity(x)
                loss, grads = gradients(x)
                seconds = clock.since(began, done(loss, grads))
            weight.assign_sub(0.0 * grads[0])
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
    share = _share_timed(None)
    assert share < 0.1, share
