"""The run-store layout: every key of a run's store prefix, and the typed record behind each.

    manifest.json                 Manifest: what the run was and what pins a rerun
    status/<node>.json            NodeState: heartbeat and progress of one node
    logs/<node>.log               the node's output
    DONE | FAILED | STOPPED       Marker: how the run ended (the first one written wins)
    metrics.json                  Metrics: what the chief measured
    checkpoints/ckpt-N.*          checkpoint files, then checkpoints/latest.json (CheckpointPointer)
    model/                        SavedModel and .keras of the trained model
    tensorboard/                  event files
    debug/request.json            a request for stack dumps; debug/<node>.stacks.txt: the dumps
    notices/<node>.<ms>.json      Notice: a spot notice a node's beacon saw, and how the node left
    owner.json                    Owner: who acts for the run now (runs.ownership), with its lease
    code/ terraform/ run-dir.tar.gz  the run's pinned code and inputs (runs.layout.pins, CodePins)
    preflight/<round>/<node>.json NodeFigures: what a node measured before the first step
    preflight/<round>/verdict.json  Verdict: the chief's judgement of that round
    preflight/history.json        the instance types' baselines when the run was deployed
    stragglers.json               Stragglers: the workers the watcher named slow while training
    sizing.json                   the sizing advisor's prediction for the run's shape (sizing.record)

and of the results bucket's `controller/` prefix, the account controller's (ControllerStore):

    controller.json               ControllerInfo: the controller, and when it last looked for runs
    handovers/<run id>.json       Handover: a run the controller is to own until it ends (sealed)
    quarantine/<name>             an object of handovers/ the controller could not read or verify
    logs/<holder>.log             a controller's own log (`dlinfra controller logs`)

No other module names a key: they ask a RunStore or the ControllerStore.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from dlinfra.contract import StoreConfig
from dlinfra.errors import StoreError
from dlinfra.runs.layout.pins import CodePins
from dlinfra.runs.layout.sizing import prediction
from dlinfra.runs.layout.synced import SyncedDirs
from dlinfra.runs.local_files import upload
from dlinfra.runs.manifest import Manifest
from dlinfra.runs.preflight import NodeFigures, Verdict
from dlinfra.runs.records import (
    MARKERS,
    SCHEMA_VERSION,
    CheckpointPointer,
    Marker,
    MarkerName,
    Metrics,
    NodeState,
    Notice,
    Owner,
    Record,
)
from dlinfra.runs.store import Store
from dlinfra.runs.store_url import open_store
from dlinfra.runs.stragglers import Stragglers

R = TypeVar("R", bound=Record)

MANIFEST = "manifest.json"
DATA_MANIFEST = "manifest.json"  # a packed data set's (`dlinfra data pack`), beside its shards
METRICS = "metrics.json"
CHECKPOINTS = "checkpoints"
LATEST_CHECKPOINT = f"{CHECKPOINTS}/latest.json"
SCRIPT_CHECKPOINTS = f"{CHECKPOINTS}/files"  # script mode: every node's checkpoint directory, merged
MODEL = "model"
TENSORBOARD = "tensorboard"
STACKS_REQUEST = "debug/request.json"
NOTICES = "notices"
PREFLIGHT = "preflight"
VERDICT = "verdict"
HISTORY = "history.json"
STRAGGLERS = "stragglers.json"
SIZING = "sizing.json"
OWNER = "owner.json"
CONTROLLER_PREFIX = "controller"
HANDOVERS = "handovers"
QUARANTINE = "quarantine"
CONTROLLER_INFO = "controller.json"
STACKS_HEADER = "# dlinfra stack dump for request "
# The results bucket's lifecycle rule expires old checkpoints by this tag (prefix patterns can't match).
CHECKPOINT_TAGS = {"dlinfra:kind": "checkpoint"}


def check_version(raw: Any, what: str) -> None:
    """A record of another schema version is refused, naming both versions and the fix."""
    found = raw.get("schema_version") if isinstance(raw, dict) else None
    if found != SCHEMA_VERSION:
        raise StoreError(
            f"{what} has schema_version {found}, this dlinfra reads {SCHEMA_VERSION}: it was written by "
            "another dlinfra version, or is not a dlinfra record. Fix: read it with the dlinfra version "
            "that wrote it (its manifest names it under versions.dlinfra)"
        )


def parse(model: type[R], raw: Any, what: str) -> R:
    check_version(raw, what)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise StoreError(f"{what} is not a valid {model.__name__} record ({problems})") from None


class RunStore(SyncedDirs, CodePins):
    """One run's prefix of the results store, read and written as typed records."""

    tagged = {SCRIPT_CHECKPOINTS: CHECKPOINT_TAGS}

    def __init__(self, store: Store):
        self.store = store

    @classmethod
    def open(cls, config: StoreConfig) -> RunStore:
        return cls(open_store(config.url, config.endpoint_url, config.region))

    def uri(self) -> str:
        return self.store.uri()

    def _read(self, model: type[R], key: str) -> R | None:
        raw = self.store.get_json(key)
        return None if raw is None else parse(model, raw, self.store.uri(key))

    def _write(self, key: str, record: Record) -> None:
        self.store.put_json(key, record.model_dump(mode="json"))

    # ---------------------------------------------------------------- manifest

    def put_manifest(self, manifest: Manifest) -> None:
        self._write(MANIFEST, manifest)

    def manifest(self) -> Manifest | None:
        return self._read(Manifest, MANIFEST)

    # ---------------------------------------------------------------- nodes: status and logs

    def status(self, node: str) -> NodeState | None:
        return self._read(NodeState, f"status/{node}.json")

    def put_status(self, state: NodeState) -> None:
        self._write(f"status/{state.node}.json", state)

    def statuses(self, nodes: list[str]) -> dict[str, NodeState | None]:
        return {name: self.status(name) for name in nodes}

    def put_log(self, node: str, path: Path) -> None:
        self.store.put_file(f"logs/{node}.log", path)

    def log_lines(self, node: str) -> list[str]:
        data = self.store.get_bytes(f"logs/{node}.log")
        return data.decode("utf-8", errors="replace").splitlines() if data else []

    # ---------------------------------------------------------------- how the run ended

    def marker(self) -> Marker | None:
        # One listing of the prefix's top level, then a read only of a marker that is there: nodes,
        # watchers and the controller ask every second or two, and three reads that mostly miss cost
        # a slow machine (a 1-vCPU instance, a VM under emulation) most of a core.
        present = {listed.name for listed in self.store.files()}
        for name in MARKERS:
            if name in present and (found := self._read(Marker, name)) is not None:
                return found
        return None

    def write_marker(self, marker: MarkerName, **fields: Any) -> None:
        """First marker wins: a run that is DONE is not later turned FAILED by a node dying late."""
        if self.marker() is None:
            self._write(marker, Marker(marker=marker, time=time.time(), **fields))

    def metrics(self) -> Metrics | None:
        return self._read(Metrics, METRICS)

    def put_metrics(self, metrics: Metrics) -> None:
        self._write(METRICS, metrics)

    # ---------------------------------------------------------------- checkpoints, model, tensorboard

    def put_checkpoint(self, step: int, directory: Path) -> CheckpointPointer:
        """The files first, then the pointer naming them."""
        prefix = f"ckpt-{step}"
        files = sorted(p for p in directory.iterdir() if p.name.startswith(prefix + "."))
        for path in files:
            self.store.put_file(f"{CHECKPOINTS}/{path.name}", path, tags=CHECKPOINT_TAGS)
        pointer = CheckpointPointer(step=step, prefix=prefix, files=[p.name for p in files], time=time.time())
        self._write(LATEST_CHECKPOINT, pointer)
        return pointer

    def latest_checkpoint(self) -> CheckpointPointer | None:
        return self._read(CheckpointPointer, LATEST_CHECKPOINT)

    def get_checkpoint(self, pointer: CheckpointPointer, local: Path) -> bool:
        """Download the files of `pointer` into `local`; False if any is missing."""
        return all(self.store.get_file(f"{CHECKPOINTS}/{name}", local / name) for name in pointer.files)

    def checkpoint_uri(self, prefix: str) -> str:
        return self.store.uri(f"{CHECKPOINTS}/{prefix}")

    def put_model(
        self, directory: Path, cap_gb: float | None = None, refused: list[str] | None = None
    ) -> str:
        """Its regular files (runs.local_files); a line for each link out or special file into `refused`."""
        listing = upload(self.store, directory, MODEL, "DLINFRA_MODEL_DIR", cap_gb)
        if refused is not None:
            refused.extend(listing.refused)
        return self.model_uri()

    def model_uri(self) -> str:
        return self.store.uri(MODEL)

    def put_tensorboard(self, directory: Path) -> None:
        upload(self.store, directory, TENSORBOARD, "tensorboard")

    def tensorboard_uri(self) -> str:
        return self.store.uri(TENSORBOARD)

    # ---------------------------------------------------------------- stack dumps of a live run

    def request_stacks(self) -> str:
        """Ask every node's beacon for a dump of its trainer's stacks; returns the request id."""
        request = f"{time.time():.6f}"
        self.store.put_json(STACKS_REQUEST, {"id": request})
        return request

    def stacks_request(self) -> str | None:
        raw = self.store.get_json(STACKS_REQUEST)
        return str(raw["id"]) if isinstance(raw, dict) and "id" in raw else None

    def put_stacks(self, node: str, request: str, text: str) -> None:
        self.store.put_bytes(f"debug/{node}.stacks.txt", f"{STACKS_HEADER}{request}\n{text}".encode())

    def stacks(self, node: str) -> tuple[str, str] | None:
        """(request id, dump) of the node's latest stack dump."""
        data = self.store.get_bytes(f"debug/{node}.stacks.txt")
        if data is None:
            return None
        header, _, text = data.decode("utf-8", errors="replace").partition("\n")
        return header.removeprefix(STACKS_HEADER), text

    def stacks_uri(self, node: str) -> str:
        return self.store.uri(f"debug/{node}.stacks.txt")

    # ---------------------------------------------------------------- spot notices

    def owner(self) -> tuple[Owner | None, str | None]:
        """The run's owner record and its version (for swap_owner)."""
        got = self.store.get_versioned(OWNER)
        if got is None:
            return None, None
        try:
            return Owner.model_validate_json(got[0]), got[1]
        except ValidationError as exc:
            raise StoreError(f"{self.store.uri(OWNER)} is not an owner record: {exc}") from None

    def swap_owner(self, owner: Owner, version: str | None) -> str | None:
        return self.store.put_if(OWNER, owner.model_dump_json().encode(), version)

    def put_notice(self, notice: Notice) -> None:
        self._write(f"{NOTICES}/{notice.key}.json", notice)

    def notice_keys(self) -> list[str]:
        """One LIST: the notices' keys (what a poller compares with what it has seen)."""
        return [key for key in self.store.list_keys(f"{NOTICES}/") if key.endswith(".json")]

    def notice(self, key: str) -> Notice | None:
        return self._read(Notice, key)

    def notices(self) -> list[Notice]:
        """Every spot notice of the run, oldest first."""
        found = [self.notice(key) for key in self.notice_keys()]
        return sorted((n for n in found if n is not None), key=lambda n: n.noticed)

    # ---------------------------------------------------------------- preflight (runs.preflight)

    def put_preflight(self, round_: int, figures: NodeFigures | Verdict) -> None:
        name = figures.node if isinstance(figures, NodeFigures) else VERDICT
        self._write(f"{PREFLIGHT}/{round_}/{name}.json", figures)

    def preflight_round(self, round_: int) -> tuple[dict[str, NodeFigures], Verdict | None]:
        """One round's node records by node, and its verdict once the chief wrote it."""
        found: dict[str, NodeFigures] = {}
        verdict = None
        for key in self.store.list_keys(f"{PREFLIGHT}/{round_}/"):
            if key.endswith(f"/{VERDICT}.json"):
                verdict = self._read(Verdict, key)
            elif key.endswith(".json") and (record := self._read(NodeFigures, key)) is not None:
                found[record.node] = record
        return found, verdict

    def put_preflight_history(self, baselines: dict[str, dict[str, float]]) -> None:
        self.store.put_json(f"{PREFLIGHT}/{HISTORY}", baselines)

    def preflight_history(self) -> dict[str, dict[str, float]]:
        """Instance type → judged figure → its baseline, as the deploy found them (see runs.preflight)."""
        return self.store.get_json(f"{PREFLIGHT}/{HISTORY}") or {}

    def preflight_rounds(self) -> int:
        """How many rounds were begun (0: preflight never ran)."""
        rounds = {key.split("/")[1] for key in self.store.list_keys(f"{PREFLIGHT}/") if key.count("/") == 2}
        return max((int(r) for r in rounds if r.isdigit()), default=0)

    def put_stragglers(self, named: Stragglers) -> None:
        self._write(STRAGGLERS, named)

    def stragglers(self) -> Stragglers:
        return self._read(Stragglers, STRAGGLERS) or Stragglers()

    def put_sizing(self, prediction: dict[str, Any]) -> None:
        self.store.put_json(SIZING, prediction)

    def sizing(self) -> dict[str, Any] | None:
        return prediction(self.store.get_json(SIZING), self.store.uri(SIZING))
