"""How the parameter-server chief paces remote work: steps per call (fixed, or `auto` from the measured
step time), and how far ahead it schedules (about a second of work, never so little that a worker
idles)."""

from __future__ import annotations

import math

import pytest

from dlinfra.training.pacing import (
    AUTO_FIRST_CALL,
    CALL_SECONDS,
    MAX_QUEUED_CHUNKS,
    MIN_QUEUED_CHUNKS,
    QUEUED_SECONDS,
    ChunkClock,
    queue_depth,
    steps_per_call,
)


@pytest.mark.parametrize(
    ("chunk_seconds", "depth"),
    [
        (0.06, MAX_QUEUED_CHUNKS),  # digits: 10 steps of 6 ms would need 17 chunks for a second
        (0.25, 4),
        (0.5, MIN_QUEUED_CHUNKS),
        (2.0, MIN_QUEUED_CHUNKS),  # ResNet-20: one chunk already hides the fetch
        (0.0, MAX_QUEUED_CHUNKS),  # a chunk timed at zero must not divide by zero
        (math.inf, MIN_QUEUED_CHUNKS),  # before the first chunk
    ],
)
def test_one_worker_gets_about_a_second_of_work_queued(chunk_seconds: float, depth: int) -> None:
    assert QUEUED_SECONDS == 1.0
    assert queue_depth(chunk_seconds, workers=1, calls_per_chunk=1) == depth


@pytest.mark.parametrize(("workers", "calls_per_chunk", "depth"), [(3, 1, 6), (8, 2, 8), (20, 2, 20)])
def test_every_worker_has_one_call_running_and_one_waiting(
    workers: int, calls_per_chunk: int, depth: int
) -> None:
    assert queue_depth(2.0, workers, calls_per_chunk) == depth
    assert queue_depth(0.01, workers, calls_per_chunk) == max(depth, MAX_QUEUED_CHUNKS)


@pytest.mark.parametrize(
    ("configured", "step_seconds", "log_every", "steps"),
    [
        (10, None, 20, 10),  # a number is used as given, measured or not
        (10, 0.001, 20, 10),
        (50, 0.1, 20, 20),  # but a call never spans more than a chunk (one progress report)
        (7, 5.0, 3, 3),
        (1, 0.001, 20, 1),
    ],
)
def test_a_configured_call_size_is_kept_within_a_chunk(
    configured: int, step_seconds: float | None, log_every: int, steps: int
) -> None:
    assert steps_per_call(configured, step_seconds, log_every) == steps


@pytest.mark.parametrize(
    ("step_seconds", "log_every", "steps"),
    [
        (None, 20, AUTO_FIRST_CALL),  # not measured yet
        (0.0107, 20, 20),  # digits (10.7 ms): 187 wanted, capped by the chunk
        (0.0107, 300, 187),
        (0.181, 20, 11),  # ResNet-20 on this CPU, as timed at one step per call (dispatch included)
        (0.6, 20, 3),
        (1.5, 20, 1),
        (30.0, 20, 1),  # a stalled worker: never 0
        (0.0, 20, 20),  # a chunk timed at zero must not divide by zero
    ],
)
def test_auto_sizes_a_call_to_about_two_seconds_of_compute(
    step_seconds: float | None, log_every: int, steps: int
) -> None:
    assert CALL_SECONDS == 2.0
    assert steps_per_call("auto", step_seconds, log_every) == steps


def test_a_worker_step_is_read_from_the_chunk_times_of_all_workers() -> None:
    clock = ChunkClock(workers=1, now=0.0)
    assert clock.fetched(1.0, 20) == pytest.approx((1.0, 0.05))
    four = ChunkClock(workers=4, now=0.0)
    assert four.fetched(1.0, 20) == pytest.approx((1.0, 0.2))  # four workers ran those steps at once


def test_chunks_finishing_in_bunches_give_a_steady_estimate() -> None:
    """Two workers, a chunk each, both done at nearly the same moment every second: one interval
    alone would read 0.01 s and 0.99 s by turns."""
    clock = ChunkClock(workers=2, now=0.0)
    estimates = []
    for second in range(1, 9):
        for lag in (0.0, 0.01):
            estimates.append(clock.fetched(second + lag, 20)[1])
    assert all(0.04 <= e <= 0.06 for e in estimates[2:]), estimates  # 2 x 20 steps per second each


def test_the_first_chunk_with_every_workers_trace_leaves_the_window() -> None:
    """Three workers whose first chunk took 8 s to trace: the next chunk is timed on its own (a
    second for 20 steps, run three at a time), not averaged with the trace."""
    clock = ChunkClock(workers=3, now=0.0)
    assert clock.fetched(8.0, 20)[1] == pytest.approx(1.2)  # the trace's own figure, used once
    assert clock.fetched(9.0, 20) == pytest.approx((1.0, 0.15))


def test_a_restart_leaves_the_pause_out() -> None:
    clock = ChunkClock(workers=1, now=0.0)
    clock.fetched(1.0, 20)
    clock.restart(31.0)  # a 30 s drain and save
    assert clock.fetched(32.0, 20) == pytest.approx((1.0, 0.05))


@pytest.mark.parametrize(
    ("workers", "step", "dispatch", "settles_at"),
    [
        (1, 0.0107, 0.008, 20),  # digits, as measured: capped by log_every
        (3, 0.03, 0.008, 20),
        (1, 0.152, 0.029, 13),  # ResNet-20, as measured: about two seconds of compute
        (1, 0.6, 0.029, 3),
        (3, 0.45, 0.04, 4),  # three ResNet-20 workers sharing two cores
    ],
)
def test_auto_settles_from_its_own_measurements(
    workers: int, step: float, dispatch: float, settles_at: int
) -> None:
    """A stand-in for the chief's loop, chunk by chunk: `workers` side by side, each call costing
    `dispatch` seconds on top of its steps; the first chunk includes the trace."""
    log_every = 20
    spe = steps_per_call("auto", None, log_every)
    clock, now, seen = ChunkClock(workers, 0.0), 0.0, []
    for chunk_index in range(12):
        calls = math.ceil(log_every / spe)
        now += (log_every * step + calls * dispatch) / workers + (3.0 if chunk_index == 0 else 0.0)
        spe = steps_per_call("auto", clock.fetched(now, log_every)[1], log_every)
        seen.append(spe)
    assert seen[-3:] == [settles_at] * 3, seen
