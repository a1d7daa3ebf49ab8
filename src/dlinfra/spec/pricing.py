"""What a run costs per hour while it runs, by role, from the instance catalog's dated prices."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HourlyCost:
    per_role: dict[str, float | None]  # role → $/h of all its nodes (None: a type or region with no price)
    extras: dict[str, float] = field(default_factory=dict)  # e.g. a NAT gateway
    unpriced: tuple[str, ...] = ()  # what has no price, e.g. "x9.huge in us-east-1"

    @property
    def known(self) -> float:
        """The priced part: roles with a known price and the extras."""
        return sum(v for v in self.per_role.values() if v is not None) + sum(self.extras.values())

    @property
    def total(self) -> float | None:
        return None if self.unpriced else self.known


# No cluster trains before its machines boot and install: on EC2 that takes minutes. The least time
# to a first checkpoint, when no earlier run of the experiment timed its steps.
BOOT_SECONDS = 120.0


@dataclass(frozen=True)
class FirstCheckpoint:
    """When a run's first checkpoint can exist, after its nodes start: what a budget must cover."""

    seconds: float
    basis: str  # how it was estimated, said in the refusal

    @classmethod
    def estimate(cls, checkpoint_every: int, seconds_per_step: float | None) -> FirstCheckpoint:
        if seconds_per_step is None:
            return cls(BOOT_SECONDS, f"{BOOT_SECONDS / 60:g} min to boot; no earlier run timed its steps")
        steps = checkpoint_every * seconds_per_step
        return cls(
            BOOT_SECONDS + steps,
            f"{BOOT_SECONDS / 60:g} min to boot, then {checkpoint_every} steps at the "
            f"{seconds_per_step:.3g} s each its last run took",
        )


def budget_problem(max_cost: float | None, cost: HourlyCost, first: FirstCheckpoint) -> str | None:
    """Why cluster.max_cost cannot be kept, or None. A target whose nodes cost nothing is not capped."""
    if max_cost is None:
        return None
    if cost.unpriced:
        return (
            f"cluster.max_cost: the catalog has no price for {', '.join(cost.unpriced)}, so the run's cost "
            "cannot be capped. Fix: choose instance types it prices (`dlinfra instances`), or drop max_cost"
        )
    least = cost.known * first.seconds / 3600
    if cost.known == 0 or max_cost >= least:
        return None
    return (
        f"cluster.max_cost: ${max_cost:g} buys {max_cost / cost.known * 60:.1f} min of this cluster at "
        f"${cost.known:.3f}/h, less than the {first.seconds / 60:.1f} min to its first checkpoint "
        f"({first.basis}): stopped at the cap, it would keep nothing. Fix: set it to "
        f"{math.ceil(least * 100) / 100:g} or more, or checkpoint sooner (training.checkpoint_every)"
    )
