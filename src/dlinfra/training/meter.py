"""Measuring a training loop: its throughput between progress reports (Meter), and how long its steps
wait on input or compute, timed inside the training call itself (InputClock, Computed). Both
strategies' loops use them (training.loop, training.parameter_servers); the node's status and the
run's metrics carry what they measure (input wait, compute seconds, steps/s and examples/s with
their spread)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


class Meter:
    """Throughput between progress reports, with each interval's length: under parameter servers
    chunks can arrive in bunches, and a plain mean of the rates would count a 10 ms interval as much
    as a 500 ms one. And how long steps waited on input: the time a training call spent in `next()`
    on its iterator, against the call's whole time, both measured inside the call (see timed)."""

    def __init__(self, step: int, batch: int):
        self.step, self.batch, self.t = step, batch, time.perf_counter()
        self.examples_per_sec: list[float] = []
        self.steps_per_sec: list[float] = []
        self.seconds: list[float] = []
        self.waited = self.busy = 0.0  # over the run
        self._interval = [0.0, 0.0]  # since the last report

    def input(self, waited: float, busy: float) -> None:
        self.waited, self.busy = self.waited + waited, self.busy + busy
        self._interval = [self._interval[0] + waited, self._interval[1] + busy]

    def interval_wait(self) -> float | None:
        """The share of step time spent waiting on input since the last call (None: nothing timed)."""
        waited, busy = self._interval
        self._interval = [0.0, 0.0]
        return waited / busy if busy > 0 else None

    @property
    def input_wait(self) -> float | None:
        return self.waited / self.busy if self.busy > 0 else None

    def tick(self, step: int) -> float:
        now = time.perf_counter()
        dt = max(now - self.t, 1e-9)
        sps = (step - self.step) / dt
        eps = sps * self.batch
        if step > self.step:
            self.steps_per_sec.append(sps)
            self.examples_per_sec.append(eps)
            self.seconds.append(dt)
        self.step, self.t = step, now
        return eps


@dataclass(frozen=True)
class InputClock:
    """How long a training call's steps wait in `next()` on their iterator, timed inside the call
    (a tf.function; on a parameter-server worker, which runs no Python). The order is explicit:
    automatic control dependencies chain timestamps with other stateful ops, but not with a read of
    an iterator (a resource), a while loop may start an iteration's read while the previous step
    still runs, and a timestamp of no dependency may run before the work it should follow.
    `on=False` under training.deterministic, where TensorFlow refuses to run a timestamp: the times
    are zero, and Meter reports the wait as None."""

    on: bool = True

    def now(self) -> Any:
        import tensorflow as tf

        return tf.timestamp() if self.on else tf.constant(0.0, tf.float64)

    def start(self) -> tuple[Any, Any]:
        """(the call's start, its seconds waited so far: a zero computed from the start, so the step
        loop, which takes it in, runs after the start is read)."""
        import tensorflow as tf

        began = self.now()
        with tf.control_dependencies([began]):
            return began, began * 0.0

    def next(self, it: Any, waited: Any, after: Any) -> tuple[Any, Any]:
        """`next(it)` once `after` (the previous step's loss) is computed, adding its seconds to
        `waited`."""
        import tensorflow as tf

        with tf.control_dependencies(tf.nest.flatten([waited, after], expand_composites=True)):
            asked = self.now()
        with tf.control_dependencies([asked]):
            batch = next(it)
        with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
            return batch, waited + (self.now() - asked)

    def after(self, after: Any) -> Any:
        """The time once every tensor of `after` is computed."""
        import tensorflow as tf

        with tf.control_dependencies(tf.nest.flatten(after, expand_composites=True)):
            return self.now()

    def since(self, began: Any, after: Any) -> Any:
        """Seconds from `began` to when every tensor of `after` is computed."""
        return self.after(after) - began


@dataclass(frozen=True)
class Computed:
    """Tensors that exist only once the given ones are computed, for a timestamp to depend on. A
    control dependency is not enough for two reasons. On the output of a nested tf.function (the
    loop's `gradients`), TensorFlow's inliner turns it into a dependency on the call's side effects
    (its variable reads), which are done long before its outputs: a timestamp there ran 0.05 ms
    after the step began, of a 22 ms step (measured). And a GPU runs its stream behind the
    executor: a control dependency orders a kernel's launch, not its end. So: an identity of each
    (a data edge), or with `host`, one element of each brought to the host, which arrives only once
    the stream has run everything before it."""

    host: bool = False

    def __call__(self, *tensors: Any) -> list[Any]:
        import tensorflow as tf

        flat = [
            tf.convert_to_tensor(t) for t in tf.nest.flatten(tensors, expand_composites=True) if t is not None
        ]
        if not self.host:
            return [tf.identity(t) for t in flat]
        ends = [tf.cast(tf.reshape(t, [-1])[:1], tf.float32) for t in flat]
        with tf.device("/device:CPU:0"):
            return [tf.identity(tf.concat(ends, 0))]
