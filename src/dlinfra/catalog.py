"""The instance catalog: every EC2 type dlinfra knows, with its hardware and dated on-demand prices.

One table (`instance_types.json`, next to this module) feeds spec validation (how many GPUs a type
has), `dlinfra plan`'s price summary, `compare`'s cost column and `dlinfra instances`. Prices are
not fetched at run time: they change, so every estimate names the table's date and source, and a
type or region missing from it is a warning, never a guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CATALOG_PATH = Path(__file__).with_name("instance_types.json")


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    memory_gib: float
    gpus: int
    gpu_model: str | None
    gpu_memory_gib: float | None  # per GPU
    network_gbps: float  # advertised ("up to" for burstable types)
    network_baseline_gbps: float
    efa: bool
    usd_per_hour: dict[str, float]  # region → on-demand Linux price

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    def price(self, region: str) -> float | None:
        return self.usd_per_hour.get(region)

    def gpu_text(self) -> str:
        """'1 x NVIDIA T4 16 GiB', or 'none'."""
        if not self.gpus:
            return "none"
        memory = f" {self.gpu_memory_gib:g} GiB" if self.gpu_memory_gib else ""
        return f"{self.gpus} x {self.gpu_model}{memory}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": self.name,
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "gpus": self.gpus,
            "gpu_model": self.gpu_model,
            "gpu_memory_gib": self.gpu_memory_gib,
            "network_gbps": self.network_gbps,
            "network_baseline_gbps": self.network_baseline_gbps,
            "efa": self.efa,
            "usd_per_hour": dict(self.usd_per_hour),
        }


@dataclass(frozen=True)
class Catalog:
    prices_as_of: str  # YYYY-MM
    price_source: str
    spec_source: str
    price_notes: str
    regions: tuple[str, ...]
    nat_gateway_usd_per_hour: dict[str, float]
    types: dict[str, InstanceType]

    def get(self, name: str) -> InstanceType | None:
        return self.types.get(name)

    def price_note(self) -> str:
        return f"{self.price_source}, as of {self.prices_as_of}"


@cache
def catalog() -> Catalog:
    data = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
    types = {
        row["type"]: InstanceType(
            name=row["type"],
            vcpus=row["vcpus"],
            memory_gib=row["memory_gib"],
            gpus=row["gpus"],
            gpu_model=row["gpu_model"],
            gpu_memory_gib=row["gpu_memory_gib"],
            network_gbps=row["network_gbps"],
            network_baseline_gbps=row["network_baseline_gbps"],
            efa=row["efa"],
            usd_per_hour=row["usd_per_hour"],
        )
        for row in data["types"]
    }
    return Catalog(
        prices_as_of=data["prices_as_of"],
        price_source=data["price_source"],
        spec_source=data["spec_source"],
        price_notes=data["price_notes"],
        regions=tuple(data["regions"]),
        nat_gateway_usd_per_hour=data["nat_gateway_usd_per_hour"],
        types=types,
    )
