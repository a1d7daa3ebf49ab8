"""How far ahead the parameter-server chief schedules: about a second of work, and never so little
that a worker idles."""

from __future__ import annotations

import math

import pytest

from dlinfra.training.loop import MAX_QUEUED_CHUNKS, MIN_QUEUED_CHUNKS, QUEUED_SECONDS, queue_depth


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
