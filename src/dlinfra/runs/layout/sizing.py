"""`<storage.url>/sizing/`: what the sizing advisor learns, shared by every experiment that stores
there (the results bucket on aws, DLINFRA_HOME/sizing for local runs without a storage.url):

    sizing/profiles/<model>/<device>.json   a model's measured step (`dlinfra profile`, or a run)
    sizing/runs/<model>.json                each run's measured throughput beside its prediction

`<model>` is a digest of what sets a step's work (the model, its input, the batch, the precision);
`<device>` an instance type, or `local-<cpu>` for this machine.
"""

from __future__ import annotations

from typing import Any

from dlinfra.runs.store import Store

SIZING = "sizing"
KEPT_RUNS = 100


class SizingHistory:
    def __init__(self, store: Store):
        self.store = store

    @classmethod
    def under(cls, storage_url: str, endpoint_url: str | None, region: str | None) -> SizingHistory:
        return cls(Store.from_url(f"{storage_url.rstrip('/')}/{SIZING}", endpoint_url, region))

    @property
    def uri(self) -> str:
        return self.store.uri("")

    def profile(self, model: str, device: str) -> dict[str, Any] | None:
        return self.store.get_json(f"profiles/{model}/{device}.json")

    def put_profile(self, model: str, device: str, record: dict[str, Any]) -> None:
        self.store.put_json(f"profiles/{model}/{device}.json", record)

    def runs(self, model: str) -> list[dict[str, Any]]:
        """Oldest first."""
        return list((self.store.get_json(f"runs/{model}.json") or {}).get("runs", []))

    def add_run(self, model: str, record: dict[str, Any]) -> None:
        kept = [r for r in self.runs(model) if r.get("run_id") != record.get("run_id")]
        self.store.put_json(f"runs/{model}.json", {"model": model, "runs": [*kept, record][-KEPT_RUNS:]})
