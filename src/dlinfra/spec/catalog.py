"""The instance catalog: every EC2 type dlinfra knows, with its hardware and dated on-demand prices.

One table (`instance_types.json`, next to this module) feeds spec validation (how many GPUs a type
has), `dlinfra plan`'s price summary, `compare`'s cost column and `dlinfra instances`. Prices are
not fetched at run time: they change, so every estimate names the table's date and source, and a
type or region missing from it is a warning, never a guess.
"""

from __future__ import annotations

import re
from functools import cache, cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict

CATALOG_PATH = Path(__file__).with_name("instance_types.json")


class InstanceType(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    vcpus: int
    memory_gib: float
    gpus: int
    gpu_model: str | None
    gpu_memory_gib: float | None  # per GPU
    network_gbps: float  # advertised ("up to" for burstable types)
    network_baseline_gbps: float
    efa: bool
    instance_store_gb: int = 0  # local NVMe SSD, all disks together (0: EBS only)
    instance_store_disks: int = 0
    usd_per_hour: dict[str, float]  # region → on-demand Linux price

    @property
    def name(self) -> str:
        return self.type

    @property
    def family(self) -> str:
        return self.type.split(".", 1)[0]

    def price(self, region: str) -> float | None:
        return self.usd_per_hour.get(region)

    def gpu_text(self) -> str:
        """'1 x NVIDIA T4 16 GiB', or 'none'."""
        if not self.gpus:
            return "none"
        memory = f" {self.gpu_memory_gib:g} GiB" if self.gpu_memory_gib else ""
        return f"{self.gpus} x {self.gpu_model}{memory}"

    def instance_store_text(self) -> str | None:
        """'250 GB NVMe instance store', '2 x 3800 GB …', or None (EBS only)."""
        if not self.instance_store_gb:
            return None
        disks = self.instance_store_disks
        each = f"{disks} x {self.instance_store_gb // disks}" if disks > 1 else str(self.instance_store_gb)
        return f"{each} GB NVMe instance store"


class Catalog(BaseModel):
    """The file as it is: `dlinfra instances --json` prints it back (filtered)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prices_as_of: str  # YYYY-MM
    price_source: str
    spec_source: str
    storage_source: str
    regions: list[str]
    price_notes: str
    nat_gateway_usd_per_hour: dict[str, float]
    public_ipv4_usd_per_hour: float  # every region: an Elastic IP (the NAT gateway's) included
    public_ipv4_source: str
    gp3_usd_per_gb_month: dict[str, float]  # EBS gp3 storage: what a stopped instance's disk costs
    gp3_source: str
    types: list[InstanceType]

    @cached_property
    def by_name(self) -> dict[str, InstanceType]:
        return {kind.type: kind for kind in self.types}

    def get(self, name: str) -> InstanceType | None:
        return self.by_name.get(name)

    def price_note(self) -> str:
        return f"{self.price_source}, as of {self.prices_as_of}"


@cache
def catalog() -> Catalog:
    return Catalog.model_validate_json(CATALOG_PATH.read_text(encoding="utf-8"))


def machine_of(instance_type: str) -> str:
    """The architecture an instance type runs: Graviton families carry a g after their generation
    (m7g, c6gn, t4g); GPU families (g5, g4dn) start with it."""
    return "aarch64" if re.match(r"^[a-z]+\d+g", instance_type) else "x86_64"
