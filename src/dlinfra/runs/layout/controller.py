"""The results bucket's `controller/` prefix (its keys are listed in the layout package's doc)."""

from __future__ import annotations

from pathlib import Path

from dlinfra.runs.layout import CONTROLLER_INFO, CONTROLLER_PREFIX, HANDOVERS, parse
from dlinfra.runs.records import ControllerInfo, Handover
from dlinfra.runs.store import Store


class ControllerStore:
    """The results bucket's `controller/` prefix: the runs handed to the account's controller, and
    its logs. One per bucket: runs of every experiment that stores there share it."""

    def __init__(self, store: Store):
        self.store = store

    @classmethod
    def of_bucket(cls, bucket: str, endpoint_url: str | None, region: str | None) -> ControllerStore:
        return cls(Store.from_url(f"s3://{bucket}/{CONTROLLER_PREFIX}", endpoint_url, region))

    def uri(self, key: str = "") -> str:
        return self.store.uri(key)

    def put_info(self, info: ControllerInfo) -> None:
        self.store.put_json(CONTROLLER_INFO, info.model_dump(mode="json"))

    def remove_info(self) -> None:
        self.store.delete(CONTROLLER_INFO)

    def info(self) -> ControllerInfo | None:
        raw = self.store.get_json(CONTROLLER_INFO)
        return None if raw is None else parse(ControllerInfo, raw, self.store.uri(CONTROLLER_INFO))

    def put_handover(self, handover: Handover) -> None:
        self.store.put_json(f"{HANDOVERS}/{handover.run_id}.json", handover.model_dump(mode="json"))

    def handovers(self) -> list[Handover]:
        """Every run handed over and not yet finished with, oldest first."""
        found = []
        for key in self.store.list_keys(f"{HANDOVERS}/"):
            if key.endswith(".json") and (raw := self.store.get_json(key)) is not None:
                found.append(parse(Handover, raw, self.store.uri(key)))
        return sorted(found, key=lambda h: h.time)

    def remove_handover(self, run_id: str) -> None:
        self.store.delete(f"{HANDOVERS}/{run_id}.json")

    def put_log(self, holder: str, path: Path) -> None:
        self.store.put_file(f"logs/{log_name(holder)}", path)

    def logs(self) -> list[str]:
        """The controllers' logs' names, newest holder last by name."""
        return [key.removeprefix("logs/") for key in self.store.list_keys("logs/")]

    def log_uri(self, name: str) -> str:
        return self.store.uri(f"logs/{name}")

    def log(self, name: str) -> str | None:
        data = self.store.get_bytes(f"logs/{name}")
        return None if data is None else data.decode("utf-8", errors="replace")


def log_name(holder: str) -> str:
    """`controller i-0abc…` → `controller-i-0abc….log`: a key without spaces."""
    return "-".join(holder.split()) + ".log"
