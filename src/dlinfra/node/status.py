"""What the trainer says about itself: its state and progress, written to a small local file.

The trainer never publishes heartbeats: a process blocked inside TensorFlow cannot be trusted to.
Its beacon (node.beacon), a separate process, reads this file, adds what it sees of the trainer from
outside, and publishes both. Only the final state goes to the store directly, so it is never lost.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dlinfra.contract import EXIT_FAILED, NodeConfig
from dlinfra.node.masked_log import masker
from dlinfra.node.supervision import restart_cause
from dlinfra.runs import restarts
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import NodeState, Restart

STATE_FILE = "state.json"
MAX_ERROR = 1500  # characters of a failure's message kept from its start, and from its end
# A trainer's way to its first step, in order: its process spawned (by the beacon), Python and dlinfra
# imported, TensorFlow loaded, every peer answering, the model and data built, the first step done.
SPAWNED_AT = "DLINFRA_SPAWNED_AT"  # set by the beacon: the trainer's process start, in epoch seconds


def state_file(work: Path) -> Path:
    return work / STATE_FILE


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class NodeStatus:
    """The trainer's own fields; `update` rewrites the local file (atomically: the beacon never reads
    half of it). Cheap enough for every progress report: no network call."""

    def __init__(self, store: RunStore, node: str, role: str, index: int, work: Path):
        self.store, self.path = store, state_file(work)
        self._writing = threading.RLock()  # the watchdog's thread writes too (one dict, one temp file)
        previous = store.status(node)
        now = time.time()
        self.fields: dict[str, Any] = {
            "node": node,
            "role": role,
            "index": index,
            "state": "starting",
            "step": previous.step if previous else 0,
            "total_steps": None,
            "loss": None,
            "examples_per_sec": None,
            "input_wait": None,
            # left by an earlier life: a restart, unless it left for a spot notice (a replacement)
            "restarts": previous.restarts + int(not previous.interrupted) if previous else 0,
            "started": now,
            "first_started": previous.first_started if previous else now,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "error": None,
            "devices": previous.devices if previous else None,
            "phases": {},
            "restart_history": [r.model_dump() for r in previous.restart_history] if previous else [],
            # what earlier lives lived through (the beacon adds this life's): a last word this life
            # publishes itself keeps them
            "incidents": [i.model_dump() for i in previous.incidents] if previous else [],
        }
        told = restart_cause(work)  # read either way: a word left for this life is no later one's
        # an earlier life of this run ended before the run did, or finished and was restarted with its
        # cluster (node.membership): this life is its restart
        self.restarted = previous is not None and (not previous.finished or told is not None)
        if previous is not None and self.restarted:
            life = len(self.fields["restart_history"]) + 2
            record = restarts.began(previous, life, now, told)
            self.fields["restart_history"].append(record.model_dump())
        spawned = os.environ.get(SPAWNED_AT, "")
        if spawned.replace(".", "", 1).isdigit():
            self.fields["phases"]["spawned"] = float(spawned)
        self.mark("up")

    def mark(self, phase: str, at: float | None = None) -> None:
        """This life reached a startup phase (contract.PHASES) at `at` (default: now)."""
        with self._writing:
            self.fields["phases"][phase] = round(time.time() if at is None else at, 3)
            self._write()
        if phase == "first step":
            self.training_again(self.fields["phases"][phase])

    @property
    def restart(self) -> Restart | None:
        """This life's restart, until it trains again (None: a first life, or trained since)."""
        if not self.restarted:
            return None
        last = Restart(**self.fields["restart_history"][-1])
        return last if last.resumed_at is None else None

    def restored(self, **found: object) -> None:
        """What this life found to resume from: checkpoint_step, restored_files, or from_scratch (where
        it looked); said at once when it found nothing."""
        if (pending := self.restart) is None:
            return
        record = pending.model_copy(update=found)
        if record.from_scratch:
            print(restarts.scratch_line(record), flush=True)
        self._set_restart(record)

    def training_again(self, at: float, step: int | None = None) -> None:
        """This life's first step (or, from a script that reports none, its first busy seconds)."""
        if (pending := self.restart) is not None:
            record = pending.model_copy(update={"resumed_at": at, "first_step": step})
            print(restarts.line(record), flush=True)
            self._set_restart(record)

    def _set_restart(self, record: Restart) -> None:
        with self._writing:
            self.fields["restart_history"][-1] = record.model_dump()
            self._write()

    @property
    def restarts(self) -> int:
        return int(self.fields["restarts"])

    @property
    def first_started(self) -> float:
        return float(self.fields["first_started"])

    def update(self, **fields: Any) -> None:
        # The stall clock starts when training does: a cluster that deadlocks before its first step
        # (a ps with one inter-op thread) is stalled, not forever "training".
        starts = fields.get("state") == "training" != self.fields.get("state")
        if isinstance(fields.get("error"), str):  # a script's last error line: what it printed
            fields["error"] = masker()(fields["error"])
        if starts or ("step" in fields and fields["step"] != self.fields.get("step")):
            fields["progress_at"] = time.time()
        with self._writing:
            self.fields.update(fields)
            self._write()

    def stop(self, **final: Any) -> None:
        """The last word of this life, published at once (the beacon may not get another beat in)."""
        self.update(**final)
        last = self.state()
        try:
            self.store.put_status(last)
        except Exception as exc:  # a store outage must not turn a clean end into a crash
            print(f"could not publish the final status: {exc}", flush=True)

    def state(self) -> NodeState:
        """This life's state as it is now, as the beacon would publish it."""
        with self._writing:
            return NodeState(**self.fields, heartbeat=time.time())

    def _write(self) -> None:
        with self._writing:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.fields), encoding="utf-8")
            tmp.replace(self.path)


def give_up(
    cfg: NodeConfig, store: RunStore, status: NodeStatus, error: str, trace: str, verdict: str = "failed"
) -> int:
    print(f"node {cfg.name} failed: {error}", file=sys.stderr, flush=True)  # whole, in the node's log
    # Masked whole, then cut: the status and the marker are read by others (the CLI prints them), and
    # a script's last lines may hold what it printed; half a secret cut off is not recognized.
    masked = masker()
    error, trace = masked(error), masked(trace)
    if len(error) > 2 * MAX_ERROR:  # the marker holds its start and its end (where TF puts the cause)
        error = f"{error[:MAX_ERROR]} … ({len(error) - 2 * MAX_ERROR} characters cut) … {error[-MAX_ERROR:]}"
    status.stop(state="failed", error=error)
    nodes = run_nodes(cfg, store, status)
    # the run's failure is the first failed node's: a peer that failed recovering from it is not
    node, after = restarts.blamed(cfg.name, nodes)
    store.write_marker(
        "FAILED",
        node=node,
        verdict=verdict,
        error=f"{error}{after}" if after else error,
        traceback=trace[-4000:],
        restarts=restarts.of_nodes(nodes.values()),
    )
    return EXIT_FAILED


def run_nodes(cfg: NodeConfig, store: RunStore, status: NodeStatus) -> dict[str, NodeState | None]:
    """Every node's last published state, this one's as it is now (for the run's restarts and blame)."""
    names = [f"{role}-{i}" for role, addresses in cfg.peers.items() for i in range(len(addresses))]
    try:
        nodes = store.statuses([n for n in names if n != cfg.name])
    except Exception as exc:  # a store outage must not keep the run's end from being written
        print(f"could not read the other nodes' states: {exc}", flush=True)
        nodes = {}
    nodes[cfg.name] = status.state()
    return nodes
