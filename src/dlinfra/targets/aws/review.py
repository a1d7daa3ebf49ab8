"""What a person reviews before an apply: resource counts from the plan, instances by role, and the
estimated cost from the dated price table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlinfra.pricing import (
    NAT_GATEWAY_USD_PER_HOUR,
    ON_DEMAND_USD_PER_HOUR,
    PRICE_SOURCE,
    PRICE_TABLE_DATE,
    HourlyCost,
)
from dlinfra.spec import Spec

NAT_GATEWAY = "NAT gateway"


def hourly_cost(spec: Spec) -> HourlyCost:
    per_role: dict[str, float | None] = {}
    unknown: list[str] = []
    for role, shape in spec.roles().items():
        price = ON_DEMAND_USD_PER_HOUR.get(shape.instance_type)
        per_role[role] = None if price is None else price * shape.count
        if price is None:
            unknown.append(shape.instance_type)
    extras = {NAT_GATEWAY: NAT_GATEWAY_USD_PER_HOUR} if spec.aws.egress == "nat" else {}
    return HourlyCost(per_role, extras, tuple(unknown))


@dataclass(frozen=True)
class PlanSummary:
    run_id: str
    name: str
    add: int
    change: int
    destroy: int
    spec: Spec
    cost: HourlyCost

    def _roles(self) -> list[tuple[str, int, str, float | None]]:
        return [
            (role, shape.count, shape.instance_type, self.cost.per_role[role])
            for role, shape in self.spec.roles().items()
        ]

    def text(self) -> str:
        counts = f"{self.add} to add, {self.change} to change, {self.destroy} to destroy"
        lines = [f"Plan for run {self.run_id}: {counts}."]
        for role, count, itype, usd in self._roles():
            price = "?" if usd is None else f"${usd:.3f}/h"
            lines.append(f"  {role:<7} {count:>3} x {itype:<14} {price}")
        lines.append(self._cost_line())
        return "\n".join(lines)

    def markdown(self) -> str:
        rows = "\n".join(
            f"| {role} | {count} | `{itype}` | " + ("unknown" if usd is None else f"${usd:.3f}") + " |"
            for role, count, itype, usd in self._roles()
        )
        return (
            f"### dlinfra plan: `{self.name}` (run `{self.run_id}`)\n\n"
            f"**{self.add}** to add, **{self.change}** to change, **{self.destroy}** to destroy.\n\n"
            "| role | nodes | instance type | $/hour (all nodes) |\n|---|---:|---|---:|\n"
            f"{rows}\n\n{self._cost_line()}\n"
        )

    def _cost_line(self) -> str:
        roles_usd = self.cost.known - sum(self.cost.extras.values())
        extras = "".join(f" + {name} ${usd:.3f}/h" for name, usd in self.cost.extras.items())
        unknown = self.cost.unknown_types
        warn = f" (no price for {', '.join(unknown)}: not counted)" if unknown else ""
        return (
            f"Estimated ${roles_usd:.2f}/hour on demand{extras}{warn}. "
            f"Prices: {PRICE_SOURCE}, as of {PRICE_TABLE_DATE}."
        )


def summarize(plan_json: dict[str, Any], run_id: str, spec: Spec) -> PlanSummary:
    counts = {"create": 0, "update": 0, "delete": 0}
    for change in plan_json.get("resource_changes", []):
        for action in change.get("change", {}).get("actions", []):
            if action in counts:
                counts[action] += 1
    return PlanSummary(
        run_id, spec.name, counts["create"], counts["update"], counts["delete"], spec, hourly_cost(spec)
    )
