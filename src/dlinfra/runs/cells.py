"""How one figure reads in a cell: the terminal's tables and the report page print it alike."""

from __future__ import annotations

from typing import Any


def num(value: Any, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def mean_sd(stat: Any, fmt: str = "{:.1f}") -> str:
    """A mean ± sd record (or its dict, from JSON)."""
    if not stat:
        return "-"
    mean, sd = (stat["mean"], stat["sd"]) if isinstance(stat, dict) else (stat.mean, stat.sd)
    return f"{fmt.format(mean)} ± {fmt.format(sd)}"
