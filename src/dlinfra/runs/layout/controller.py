"""The results bucket's `controller/` prefix (its keys are listed in the layout package's doc)."""

from __future__ import annotations

import json
from pathlib import Path

from dlinfra.contract import StoreConfig
from dlinfra.errors import StoreError
from dlinfra.runs.layout import (
    CONTROLLER_INFO,
    CONTROLLER_PREFIX,
    HANDOVERS,
    QUARANTINE,
    SCHEMA_VERSION,
    parse,
)
from dlinfra.runs.records import ControllerInfo, Handover
from dlinfra.runs.store import Store
from dlinfra.runs.store_url import open_store

MAX_RECORD_BYTES = 64 * 1024  # a hand-over record is under 1 KB; a larger object is not read


class ControllerStore:
    """The results bucket's `controller/` prefix: the runs handed to the account's controller, and
    its logs. One per bucket: runs of every experiment that stores there share it."""

    def __init__(self, store: Store, bucket: str, endpoint_url: str | None, region: str | None):
        self.store = store
        # how this side reaches its bucket: the only bucket and endpoint a controller ever uses
        self.bucket, self.endpoint_url, self.region = bucket, endpoint_url, region
        self._sizes: dict[str, int] = {}  # the hand-over prefix's objects at the last listing

    @classmethod
    def of_bucket(cls, bucket: str, endpoint_url: str | None, region: str | None) -> ControllerStore:
        store = open_store(f"s3://{bucket}/{CONTROLLER_PREFIX}", endpoint_url, region)
        return cls(store, bucket, endpoint_url, region)

    def run_store(self, url: str, run_id: str) -> StoreConfig | None:
        """A run's store as this side reaches it, if `url` is a run's prefix in this bucket (None:
        another bucket, or not this run's)."""
        if not url.startswith(f"s3://{self.bucket}/") or not url.endswith(f"/{run_id}"):
            return None
        if any(part in ("", ".", "..") for part in url.removeprefix("s3://").split("/")):
            return None
        return StoreConfig(url=url, endpoint_url=self.endpoint_url, region=self.region)

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
        """Every run handed over and not yet finished with, oldest first (a record that does not
        read as one is left out: `listed` names it)."""
        found = [record for _, record in self.listed() if isinstance(record, Handover)]
        return sorted(found, key=lambda h: h.time)

    def listed(self) -> list[tuple[str, Handover | str]]:
        """Every object of the hand-over prefix: its key, and its record or why it is none. Only
        what could be a record is read: a planted object of gigabytes is never loaded."""
        self._sizes = {f"{HANDOVERS}/{f.name}": f.bytes for f in self.store.files(f"{HANDOVERS}/")}
        found: list[tuple[str, Handover | str]] = []
        for key in self.store.list_keys(f"{HANDOVERS}/"):
            size = self._sizes.get(key)
            if size is None or size > MAX_RECORD_BYTES:
                why = "not a record's key" if size is None else f"{size} bytes, more than a record's"
                found.append((key, why))
            elif (data := self.store.get_bytes(key)) is not None:  # None: removed since the listing
                found.append((key, _handover(key, data, self.store.uri(key))))
        return found

    def quarantine(self, key: str) -> str:
        """Move an object out of the hand-over prefix, never to be read as one again; where it went.
        StoreError: it could not be moved (one too large to read is left where it is)."""
        size = self._sizes.get(key)
        if size is None or size > MAX_RECORD_BYTES:
            raise StoreError("left in place: not read, so not moved")
        moved = f"{QUARANTINE}/{key.removeprefix(HANDOVERS + '/')}"
        data = self.store.get_bytes(key)
        if data is not None:
            self.store.put_bytes(moved, data)
        self.store.delete(key)
        return self.store.uri(moved)

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


def _handover(key: str, data: bytes, uri: str) -> Handover | str:
    """The record, or why it is none (the problem, never the content)."""
    if not key.endswith(".json"):
        return "not a .json record"
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "not JSON"
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        return f"not a hand-over record of schema version {SCHEMA_VERSION}"
    try:
        return parse(Handover, raw, uri)
    except StoreError as exc:
        return str(exc)[:400]  # names fields, never their values; a planted key name is cut short
