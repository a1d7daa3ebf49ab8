"""Spot capacity during a run: which nodes left for a spot notice and must be replaced now, and what a
replacement does when EC2 has no spot capacity for it (cluster.workers.spot.fallback). Pure functions
of plain data, so every decision is tested table by table; healing carries them out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dlinfra.runs.manifest import Heal
from dlinfra.runs.records import Notice

# What EC2 (through the provider's error text) says when a spot request cannot be filled now.
CAPACITY_ERRORS = (
    "InsufficientInstanceCapacity",
    "SpotMaxPriceTooLow",
    "capacity-not-available",
    "InsufficientCapacity",
    "MaxSpotInstanceCountExceeded",
    "no Spot capacity available",
)
FIRST_WAIT = 10.0
MAX_WAIT = 120.0


def is_capacity_error(text: str) -> bool:
    return any(marker in text for marker in CAPACITY_ERRORS)


@dataclass(frozen=True)
class Decision:
    action: Literal["on_demand", "retry", "fail"]
    message: str
    wait: float = 0.0  # retry: seconds before the next attempt


def decide(
    fallback: str, nodes: list[str], error: str, attempt: int, waited: float, heal_timeout: float
) -> Decision:
    """What to do after the `attempt`-th (1, 2, …) replacement of spot `nodes` failed for capacity,
    `waited` seconds after the first such failure."""
    names = ", ".join(nodes)
    reason = next((marker for marker in CAPACITY_ERRORS if marker in error), "no spot capacity")
    if fallback == "on_demand":
        return Decision(
            "on_demand", f"{names}: no spot capacity ({reason}): replacing on demand (spot.fallback)"
        )
    if fallback == "wait":
        wait = min(FIRST_WAIT * 2 ** (attempt - 1), MAX_WAIT)
        if waited + wait <= heal_timeout:
            return Decision(
                "retry", f"{names}: no spot capacity ({reason}): retrying in {wait:.0f}s", wait=wait
            )
        return Decision(
            "fail",
            f"no spot capacity to replace {names} within aws.heal_timeout ({heal_timeout:.0f}s; {reason}). "
            "Fix: set cluster.workers.spot.fallback: on_demand, raise aws.heal_timeout, or choose another "
            "cluster.workers.instance_type or aws.region",
        )
    return Decision(
        "fail",
        f"no spot capacity to replace {names} ({reason}), and cluster.workers.spot.fallback is fail. "
        "Fix: set cluster.workers.spot.fallback: on_demand or wait, or choose another "
        "cluster.workers.instance_type or aws.region",
    )


def left_for_notice(notices: list[Notice], instances: dict[str, str], heals: list[Heal]) -> dict[str, Notice]:
    """node → the notice it left for, for every node of the run that left and was not replaced since
    (a heal records the notice it answered)."""
    answered = {(h.node, h.noticed) for h in heals if h.reason == "interrupted"}
    return {
        n.node: n
        for n in notices
        if n.acted and n.left is not None and n.node in instances and (n.node, n.noticed) not in answered
    }
