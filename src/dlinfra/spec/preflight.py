"""Proving the nodes before the expensive part (`cluster.preflight`) and naming a slow one while it
trains (`cluster.straggler`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from dlinfra.spec.input import StrictModel, shown

CHECKS = ("quick", "full", "off")


class PreflightSpec(StrictModel):
    checks: Literal["quick", "full", "off"] | None = Field(
        None,
        description="What every node measures before the first step (device, links, input, versions): "
        "quick (seconds), full (steadier figures, about 20 s a node) or off. Default: quick on aws; "
        "off on local, where the nodes share one machine and its figures say nothing about hardware.",
    )
    min_ratio: float = Field(
        0.8,
        gt=0,
        le=1,
        description="A node below this share of its role's median on any figure is flagged.",
    )
    on_fail: Literal["replace", "fail", "warn"] | None = Field(
        None,
        description="A flagged node: replace it once and check again (aws default), fail the run before "
        "its first step (local default: a replacement there is the same machine), or warn and train.",
    )
    only: bool = Field(False, description="Stop after the checks, training nothing (`dlinfra preflight`).")


def preflight_shorthand(value: Any) -> Any:
    """`preflight: quick` is {checks: quick}."""
    if isinstance(value, str):
        if value not in CHECKS:
            raise ValueError(
                f"must be quick, full or off (got {shown(value)}). Fix: preflight: quick, or "
                "preflight: {checks: quick, min_ratio: 0.8, on_fail: replace | fail | warn}"
            )
        return {"checks": value}
    if value is False:  # YAML reads a bare `off` as false
        return {"checks": "off"}
    return value


class StragglerSpec(StrictModel):
    ratio: float = Field(
        1.5,
        gt=1,
        le=100,
        description="A worker whose seconds per step are this many times its peers' median is slow.",
    )
    window: float = Field(
        60, gt=0, le=24 * 3600, description="Seconds a worker must stay that slow before it is named."
    )
    action: Literal["report", "replace"] = Field(
        "report",
        description="report: a straggler verdict in status, the watch view and the run's result. "
        "replace: that, and its instance is replaced like a lost one (aws; once per worker). On local, "
        "where every node shares this machine, a replacement would be the same: reported only.",
    )
