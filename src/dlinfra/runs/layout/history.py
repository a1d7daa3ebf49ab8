"""`<storage.url>/preflight-history/<instance type>.json`: what preflight measured on each instance
type in earlier runs of every experiment that stores there (runs.preflight_history)."""

from __future__ import annotations

from typing import Any

from dlinfra.runs.store import Store
from dlinfra.runs.store_url import open_store

PREFLIGHT_HISTORY = "preflight-history"


class TypeHistory:
    def __init__(self, store: Store):
        self.store = store

    @classmethod
    def under(cls, storage_url: str, endpoint_url: str | None, region: str | None) -> TypeHistory:
        return cls(open_store(f"{storage_url.rstrip('/')}/{PREFLIGHT_HISTORY}", endpoint_url, region))

    def runs(self, instance_type: str) -> list[dict[str, Any]]:
        """Oldest first: {run_id, time, figures: figure → the run's median on the type}."""
        return list((self.store.get_json(f"{instance_type}.json") or {}).get("runs", []))

    def put_runs(self, instance_type: str, runs: list[dict[str, Any]]) -> None:
        self.store.put_json(f"{instance_type}.json", {"instance_type": instance_type, "runs": runs})
