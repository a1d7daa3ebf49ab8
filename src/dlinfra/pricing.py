"""A dated on-demand price table for cost estimates (plans, compare). Not fetched at run time: prices
change, so every estimate names this table's date and source, and unknown types are a warning."""

from __future__ import annotations

from dataclasses import dataclass, field

PRICE_TABLE_DATE = "2025-06"
PRICE_SOURCE = (
    "AWS EC2 On-Demand pricing page, Linux, us-east-1 (https://aws.amazon.com/ec2/pricing/on-demand/)"
)

# USD per instance-hour, on-demand, us-east-1, Linux.
ON_DEMAND_USD_PER_HOUR: dict[str, float] = {
    "t3.medium": 0.0416,
    "t3.large": 0.0832,
    "m5.large": 0.096,
    "m5.xlarge": 0.192,
    "m5.2xlarge": 0.384,
    "m5.4xlarge": 0.768,
    "c5.xlarge": 0.17,
    "c5.2xlarge": 0.34,
    "c5.4xlarge": 0.68,
    "r5.xlarge": 0.252,
    "g4dn.xlarge": 0.526,
    "g4dn.2xlarge": 0.752,
    "g4dn.12xlarge": 3.912,
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g5.12xlarge": 5.672,
    "p3.2xlarge": 3.06,
    "p3.8xlarge": 12.24,
    "p4d.24xlarge": 32.7726,
}
NAT_GATEWAY_USD_PER_HOUR = 0.045


@dataclass(frozen=True)
class HourlyCost:
    """What a run costs per hour while it runs, by role, from the dated table above."""

    per_role: dict[str, float | None]  # role → $/h of all its nodes (None: a type with no price)
    extras: dict[str, float] = field(default_factory=dict)  # e.g. a NAT gateway
    unknown_types: tuple[str, ...] = ()

    @property
    def known(self) -> float:
        """The priced part: roles with a known price and the extras."""
        return sum(v for v in self.per_role.values() if v is not None) + sum(self.extras.values())

    @property
    def total(self) -> float | None:
        return None if self.unknown_types else self.known
