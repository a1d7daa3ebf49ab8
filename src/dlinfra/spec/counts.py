"""Counts a spec field takes as a number or `auto` (GPUs per worker, steps per remote call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_COUNT = 10**9  # steps and step intervals: far past any run, well inside every integer type


def auto_or_count(low: int, high: int, unit: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"must be auto or a whole number of {unit} from {low} to {high} (got {value!r})")
        return value

    return check
