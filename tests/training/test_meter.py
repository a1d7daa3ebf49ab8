"""Throughput in metrics.json: the mean of a run's rates is its work over its time, whatever the
lengths of the intervals between progress reports."""

from __future__ import annotations

import pytest

from dlinfra.node.reporting import mean_sd


def test_bunched_reports_inflate_neither_the_mean_nor_the_spread() -> None:
    """Parameter-server chunks arrive in bunches: 10 steps in 10 ms, then 10 in 490 ms. A plain mean
    of the two rates would read 510 steps/s; the run did 20 steps in 0.5 s. And within one second
    they are no spread: the 10 ms interval's 1000 steps/s is not a rate the run ever ran at."""
    rates, seconds = [5.0, 1000.0, 10 / 0.49], [2.0, 0.01, 0.49]  # the first interval is the warm-up
    result = mean_sd(rates, seconds)
    assert result is not None
    assert result.mean == pytest.approx(40.0)
    assert result.sd == pytest.approx(0.0)


def test_the_spread_is_of_spans_of_a_second_or_more() -> None:
    """Two seconds at 100 steps/s (in bunches), then a second and a half at 200: spread between the
    spans, each weighted by its length; the rest shorter than a second joins the last span."""
    first = [(5.0, 2.0)]  # warm-up, left out
    slow = [(1000.0, 0.05), (50 / 0.95, 0.95)] * 2  # 100 steps in each second, 50 of them in 50 ms
    fast = [(200.0, 1.0), (200.0, 0.5)]
    rates, seconds = zip(*(first + slow + fast), strict=True)
    result = mean_sd(list(rates), list(seconds))
    assert result is not None
    assert result.mean == pytest.approx((200 + 300) / 3.5)
    spans = [(100.0, 1.0), (100.0, 1.0), (200.0, 1.5)]
    expected = (sum(w * (r - result.mean) ** 2 for r, w in spans) / 3.5) ** 0.5
    assert result.sd == pytest.approx(expected)


def test_steady_intervals_give_their_rate_and_no_spread() -> None:
    result = mean_sd([7.0, 100.0, 100.0, 100.0], [3.0, 0.2, 0.3, 0.5])
    assert result is not None and result.mean == pytest.approx(100.0) and result.sd == pytest.approx(0.0)


def test_one_or_two_intervals_keep_the_first_and_none_give_nothing() -> None:
    only = mean_sd([50.0], [1.0])
    assert only is not None and (only.mean, only.sd) == (50.0, 0.0)
    two = mean_sd([10.0, 30.0], [1.0, 1.0])
    assert two is not None and two.mean == pytest.approx(20.0)
    assert mean_sd([], []) is None
