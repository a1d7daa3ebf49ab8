"""Throughput in metrics.json: the mean of a run's rates is its work over its time, whatever the
lengths of the intervals between progress reports."""

from __future__ import annotations

import pytest

from dlinfra.node.reporting import mean_sd


def test_bunched_reports_do_not_inflate_the_mean() -> None:
    """Parameter-server chunks arrive in bunches: 10 steps in 10 ms, then 10 in 490 ms. A plain mean
    of the two rates would read 510 steps/s; the run did 20 steps in 0.5 s."""
    rates, seconds = [5.0, 1000.0, 10 / 0.49], [2.0, 0.01, 0.49]  # the first interval is the warm-up
    result = mean_sd(rates, seconds)
    assert result is not None
    assert result.mean == pytest.approx(40.0)
    assert result.sd == pytest.approx(((0.01 * 960**2 + 0.49 * (10 / 0.49 - 40) ** 2) / 0.5) ** 0.5)


def test_steady_intervals_give_their_rate_and_no_spread() -> None:
    result = mean_sd([7.0, 100.0, 100.0, 100.0], [3.0, 0.2, 0.3, 0.5])
    assert result is not None and result.mean == pytest.approx(100.0) and result.sd == pytest.approx(0.0)


def test_one_or_two_intervals_keep_the_first_and_none_give_nothing() -> None:
    only = mean_sd([50.0], [1.0])
    assert only is not None and (only.mean, only.sd) == (50.0, 0.0)
    two = mean_sd([10.0, 30.0], [1.0, 1.0])
    assert two is not None and two.mean == pytest.approx(20.0)
    assert mean_sd([], []) is None
