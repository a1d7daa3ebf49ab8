"""What a person reviews before an apply: resource counts from the plan, instances by role with their
hardware, and the estimated cost, all from the instance catalog."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlinfra.spec.catalog import catalog
from dlinfra.spec.hardware import RoleHardware, cluster_hardware
from dlinfra.spec.model import Spec
from dlinfra.spec.pricing import HourlyCost

NAT_GATEWAY = "NAT gateway"
# EC2 counts vCPUs against one quota per family group (Service Quotas names them so). Where a new
# account's default sits varies and AWS raises it on request; past these, many accounts are refused.
QUOTA_GROUPS = {
    "Standard (A, C, D, H, I, M, R, T, Z)": (frozenset("acdhimrtz"), 32),
    "G and VT": (frozenset({"g", "vt"}), 8),
    "P": (frozenset({"p"}), 8),
}


def hourly_cost(spec: Spec) -> HourlyCost:
    region = spec.aws.region
    per_role: dict[str, float | None] = {}
    unpriced: list[str] = []
    for role, shape in spec.roles().items():
        kind = catalog().get(shape.instance_type)
        price = kind.price(region) if kind else None
        per_role[role] = None if price is None else price * shape.count
        if price is None:
            unpriced.append(f"{shape.instance_type} in {region}")
    extras = {}
    if spec.aws.needs_nat:
        nat = catalog().nat_gateway_usd_per_hour.get(region)
        if nat is None:
            unpriced.append(f"the NAT gateway in {region}")
        else:
            extras[NAT_GATEWAY] = nat
    return HourlyCost(per_role, extras, tuple(unpriced))


def quota_usage(spec: Spec) -> dict[str, int]:
    """'Running On-Demand <group> instances' (or 'All <group> Spot Instance Requests') → the vCPUs
    this cluster needs of it; types the catalog does not know are not counted."""
    used: dict[str, int] = {}
    for shape in spec.roles().values():
        kind = catalog().get(shape.instance_type)
        if kind is None:
            continue
        letters = "vt" if kind.family.startswith("vt") else kind.family[0]
        group = next((name for name, (prefixes, _) in QUOTA_GROUPS.items() if letters in prefixes), None)
        name = f"All {group} Spot Instance Requests" if shape.spot else f"Running On-Demand {group} instances"
        if group is None:
            name = f"the {kind.family} instances quota"
        used[name] = used.get(name, 0) + kind.vcpus * shape.count
    return used


def quota_warnings(spec: Spec) -> list[str]:
    """Clusters past what many accounts may run by default: the apply would fail half-way."""
    out = []
    for name, vcpus in quota_usage(spec).items():
        limit = next((lim for group, (_, lim) in QUOTA_GROUPS.items() if group in name), None)
        if limit is not None and vcpus > limit:
            out.append(
                f"{vcpus} vCPUs of {name}: many accounts' default quota is {limit} or less, and the apply "
                "would stop with VcpuLimitExceeded. Fix: check Service Quotas in the region first"
            )
    return out


@dataclass(frozen=True)
class PlanSummary:
    run_id: str
    name: str
    add: int
    change: int
    destroy: int
    spec: Spec
    cost: HourlyCost
    images: str = ""

    def _roles(self) -> list[tuple[RoleHardware, float | None]]:
        hardware = cluster_hardware(self.spec, typed=True)
        return [(hw, self.cost.per_role[role]) for role, hw in hardware.items()]

    def text(self) -> str:
        counts = f"{self.add} to add, {self.change} to change, {self.destroy} to destroy"
        lines = [f"Plan for run {self.run_id}: {counts}."]
        for hw, usd in self._roles():
            price = "$?/h" if usd is None else f"${usd:.3f}/h"
            lines.append(f"  {hw.role:<7} {hw.count:>3} x {hw.describe(typed=True)} · {price}")
        lines.append(self._cost_line())
        if spot := spot_line(self.spec, self.cost):
            lines.append(spot)
        lines += [self._runtime_line(), self._unwatched_line()]
        if self.images:
            lines.append(self.images)
        return "\n".join(lines)

    def markdown(self) -> str:
        rows = "\n".join(
            f"| {hw.role} | {hw.count} | `{hw.instance_type}` | {_cell(hw.kind.vcpus if hw.kind else None)} "
            f"| {_gpu_cell(hw)} | " + ("unknown" if usd is None else f"${usd:.3f}") + " |"
            for hw, usd in self._roles()
        )
        return (
            f"### dlinfra plan: `{self.name}` (run `{self.run_id}`)\n\n"
            f"**{self.add}** to add, **{self.change}** to change, **{self.destroy}** to destroy.\n\n"
            "| role | nodes | instance type | vCPUs each | GPUs each (used) | $/hour (all nodes) |\n"
            "|---|---:|---|---:|---|---:|\n"
            f"{rows}\n\n{self._cost_line()}\n"
            + (f"\n{spot}\n" if (spot := spot_line(self.spec, self.cost)) else "")
            + f"\n{self._runtime_line()}\n\n{self._unwatched_line()}\n"
            + (f"\n{self.images}\n" if self.images else "")
        )

    def _runtime_line(self) -> str:
        """The most the run can cost: every node stops itself at max_runtime, watched or not."""
        hours = self.spec.cluster.max_runtime / 3600
        cap = self.spec.cluster.max_cost
        if cap is not None and self.cost.known and cap < self.cost.known * hours:
            return (
                f"At cluster.max_cost (${cap:g}): the run checkpoints and stops after "
                f"{cap / self.cost.known * 60:.1f} min at ${self.cost.known:.3f}/h, counted from each node's "
                f"start, watched or not (max_runtime, {hours:g} h, allows ${self.cost.known * hours:.2f})."
            )
        return (
            f"At max_runtime ({hours:g} h): at most ${self.cost.known * hours:.2f}, priced as above; "
            "every node stops itself then (cluster.max_runtime)."
        )

    def _unwatched_line(self) -> str:
        """What stays up when the run ends with nobody watching: the nodes power off and terminate,
        the stack's network does not."""
        left = "If the run ends with nobody watching, its instances stop and terminate themselves"
        if not self.spec.aws.needs_nat:  # a VPC, subnets, a security group, a gateway endpoint: free
            return f"{left}; what stays up (the VPC, its subnets and security group) costs nothing."
        nat = self.cost.extras.get(NAT_GATEWAY)
        usd = "an unpriced amount" if nat is None else f"${nat + catalog().public_ipv4_usd_per_hour:.3f}/h"
        return (
            f"{left}; the NAT gateway and its Elastic IP stay up at {usd} until "
            f"`dlinfra watch {self.run_id}` or `dlinfra destroy --ended` removes them (aws.egress: none "
            "or public_ip has no NAT gateway)."
        )

    def _cost_line(self) -> str:
        roles_usd = self.cost.known - sum(self.cost.extras.values())
        extras = "".join(f" + {name} ${usd:.3f}/h" for name, usd in self.cost.extras.items())
        unpriced = self.cost.unpriced
        warn = f" (no price for {', '.join(unpriced)}: not counted)" if unpriced else ""
        return f"Estimated ${roles_usd:.2f}/hour on demand{extras}{warn}. Prices: {catalog().price_note()}."


def spot_line(spec: Spec, cost: HourlyCost) -> str | None:
    """Spot workers: the estimate above is the worst case (all on demand, what a fallback pays); what
    spot saves is said only from a spot price the spec gives, with its date."""
    spot, workers = spec.cluster.workers.spot, spec.cluster.workers.count
    if not spot.enabled:
        return None
    fallback = f"a replacement without spot capacity: {spot.fallback} (cluster.workers.spot.fallback)"
    per_worker = cost.per_role.get("worker")
    if spot.price_per_hour is None or per_worker is None:
        return (
            "Spot workers: the estimate above is the worst case (every worker on demand); no spot price is "
            "known (set cluster.workers.spot.price_per_hour and price_as_of to see the spot estimate); "
            f"{fallback}."
        )
    expected = cost.known - workers * (per_worker / workers - spot.price_per_hour)
    return (
        f"Spot workers at ${spot.price_per_hour:.3f}/h each (as of {spot.price_as_of}): about "
        f"${expected:.2f}/hour; worst case ${cost.known:.2f}/hour, every worker on demand; {fallback}."
    )


def _cell(value: int | None) -> str:
    return "?" if value is None else str(value)


def _gpu_cell(hw: RoleHardware) -> str:
    if hw.kind is None:
        return f"? ({hw.gpus})"
    return f"{hw.kind.gpu_text()} ({hw.gpus})" if hw.kind.gpus else "-"


def summarize(plan_json: dict[str, Any], run_id: str, spec: Spec, images: str = "") -> PlanSummary:
    counts = {"create": 0, "update": 0, "delete": 0}
    for change in plan_json.get("resource_changes", []):
        for action in change.get("change", {}).get("actions", []):
            if action in counts:
                counts[action] += 1
    return PlanSummary(
        run_id,
        spec.name,
        counts["create"],
        counts["update"],
        counts["delete"],
        spec,
        hourly_cost(spec),
        images,
    )
