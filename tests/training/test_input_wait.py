"""The input-wait share, measured inside a real tf.function loop the way both training loops measure
it: a pipeline slower than the step shows as waiting, a step slower than its pipeline does not. The
two cases differ by far more than any load on this machine can blur (sleeps, not computation)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf

from dlinfra.runs.results import input_bound
from dlinfra.training.meter import InputClock, Meter

# seconds: a slow element, or a slow step. Long beside what fetching an element costs a loaded
# machine (at 0.02 s, a CI run's fast pipeline read as 23 % waiting: its overheads, not a wait).
SLOW = 0.2


def _sleep(seconds: float) -> object:
    def sleep(x: tf.Tensor) -> tf.Tensor:
        time.sleep(seconds)
        return x

    return sleep


def _share_waiting(element_seconds: float, step_seconds: float, steps: int = 8) -> float | None:
    data = tf.data.Dataset.range(10_000).map(lambda x: tf.py_function(_sleep(element_seconds), [x], tf.int64))
    it = iter(data.prefetch(1))
    clock = InputClock()

    @tf.function
    def train_steps(it: object, n: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        began, waited = clock.start()
        total = tf.constant(0, tf.int64)
        for _ in tf.range(n):
            x, waited = clock.next(it, waited, total)
            total += tf.ensure_shape(tf.py_function(_sleep(step_seconds), [x], tf.int64), [])
        return waited, clock.since(began, (total, waited))

    meter = Meter(0, 1)
    for _ in range(2):
        waited, busy = train_steps(it, tf.constant(steps))
        meter.input(float(waited), float(busy))
    since_last_report = meter.interval_wait()
    assert since_last_report == meter.input_wait, "one report after both calls: the same share"
    assert meter.interval_wait() is None, "nothing timed since that report"
    return meter.input_wait


def test_a_pipeline_slower_than_the_step_shows_as_waiting() -> None:
    share = _share_waiting(element_seconds=SLOW, step_seconds=0.0)
    assert share is not None and share > 0.8, share


def test_a_step_slower_than_its_pipeline_does_not() -> None:
    share = _share_waiting(element_seconds=0.0, step_seconds=SLOW)
    assert share is not None and share < 0.2, share


@pytest.mark.parametrize(("wait", "bound"), [(None, False), (0.05, False), (0.10, False), (0.35, True)])
def test_the_result_calls_a_run_input_bound_over_a_tenth(wait: float | None, bound: bool) -> None:
    advice = input_bound(wait)
    assert (advice is not None) == bound
    if advice:
        assert advice.startswith("input-bound: steps waited 35% of their time") and "Fix:" in advice


def test_under_op_determinism_the_loop_runs_and_the_wait_is_not_measured(tmp_path: Path) -> None:
    """TensorFlow refuses timestamps when op determinism is on (training.deterministic): the steps
    run, and the wait is None ("-"), not a number. In a process of its own: determinism cannot be
    turned off again (and from a file: autograph reads the loop's source)."""
    program = (
        "import tensorflow as tf\n"
        "from dlinfra.training.meter import InputClock, Meter\n"
        "tf.config.experimental.enable_op_determinism()\n"
        "clock = InputClock(on=False)  # what the loops build under training.deterministic\n"
        "it = iter(tf.data.Dataset.range(100).repeat())\n"
        "@tf.function\n"
        "def steps(it, n):\n"
        "    began, waited = clock.start()\n"
        "    total = tf.constant(0, tf.int64)\n"
        "    for _ in tf.range(n):\n"
        "        x, waited = clock.next(it, waited, total)\n"
        "        total += x\n"
        "    return total, waited, clock.since(began, (total, waited))\n"
        "total, waited, busy = steps(it, tf.constant(10))\n"
        "meter = Meter(0, 1)\n"
        "meter.input(float(waited), float(busy))\n"
        "print(int(total), meter.input_wait)\n"
    )
    (tmp_path / "deterministic.py").write_text(program)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "deterministic.py")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["45", "None"]
