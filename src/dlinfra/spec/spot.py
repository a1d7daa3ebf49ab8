"""Spot capacity in the experiment file: the workers' (`cluster.workers.spot`) and the cluster's policy
for EC2's notices (`cluster.spot`)."""

from __future__ import annotations

import datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dlinfra.spec.input import StrictModel, shown


class SpotSpec(StrictModel):
    enabled: bool = Field(False, description="Run the workers on spot capacity (aws).")
    fallback: Literal["on_demand", "wait", "fail"] = Field(
        "on_demand",
        description="When a replacement finds no spot capacity: on_demand replaces that node on demand; "
        "wait retries with backoff for aws.heal_timeout; fail ends the run, naming the node.",
    )
    price_per_hour: float | None = Field(
        None, gt=0, le=1000, description="Spot $/h of one worker, for cost estimates (needs price_as_of)."
    )
    price_as_of: str | None = Field(
        None,
        pattern=r"^\d{4}-\d{2}(-\d{2})?$",
        description="When price_per_hour was read (YYYY-MM or YYYY-MM-DD): spot prices move.",
    )

    @field_validator("price_as_of", mode="before")
    @classmethod
    def _date_text(cls, v: Any) -> Any:
        return v.isoformat() if isinstance(v, datetime.date) else v  # YAML reads 2026-11-01 as a date

    @model_validator(mode="after")
    def _dated(self) -> SpotSpec:
        if self.price_per_hour is not None and self.price_as_of is None:
            raise ValueError(
                "price_per_hour needs price_as_of, the date it was read (spot prices move). "
                "Fix: add cluster.workers.spot.price_as_of: YYYY-MM-DD"
            )
        return self


def spot_shorthand(value: Any) -> Any:
    """`spot: true` (the original form) stays valid: it is {enabled: true}."""
    if isinstance(value, bool):
        return {"enabled": value}
    if not isinstance(value, dict | SpotSpec):
        raise ValueError(
            f"must be true, false or a mapping (got {shown(value)}). Fix: spot: true, or "
            "spot: {enabled: true, fallback: on_demand | wait | fail}"
        )
    return value


class SpotPolicy(StrictModel):
    act_on_rebalance: bool = Field(
        False,
        description="A rebalance recommendation (EC2's early warning) is acted on like an interruption "
        "notice (checkpoint, leave, replace); else it is only logged and shown in `dlinfra status`.",
    )
