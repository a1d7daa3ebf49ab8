"""What a run costs per hour while it runs, by role, from the instance catalog's dated prices."""

from __future__ import annotations

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
