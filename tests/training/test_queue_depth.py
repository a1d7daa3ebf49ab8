"""How far ahead the parameter-server chief schedules: about a second of work, within bounds."""

from __future__ import annotations

import pytest

from dlinfra.training.loop import MAX_QUEUED_CHUNKS, MIN_QUEUED_CHUNKS, QUEUED_SECONDS, queue_depth


@pytest.mark.parametrize(
    ("chunk_seconds", "depth"),
    [
        (0.06, MAX_QUEUED_CHUNKS),  # digits: 10 steps of 6 ms would need 17 chunks for a second
        (0.25, 4),
        (0.5, MIN_QUEUED_CHUNKS),
        (2.0, MIN_QUEUED_CHUNKS),  # ResNet-20: one chunk already hides the fetch
        (0.0, MAX_QUEUED_CHUNKS),  # a first chunk timed at zero must not divide by zero
    ],
)
def test_queue_depth_covers_about_a_second_of_work(chunk_seconds: float, depth: int) -> None:
    assert QUEUED_SECONDS == 1.0
    assert queue_depth(chunk_seconds) == depth
