"""What a node lives through without losing its life, as its beacon sees it from outside the trainer:
the trainer stopped and thawed, the store out of reach while the beacon wrote to it. The run's result
names them beside its restarts (runs.incidents), so a run that ends DONE still says what it met."""

from __future__ import annotations

import threading
import time

from dlinfra.runs.records import Incident, IncidentKind, NodeState

# Shorter than this is noise, not a fault: one retried request, a stop seen at a single look.
MIN_SECONDS = 1.0


class Survived:
    def __init__(self, node: str, earlier: NodeState | None = None) -> None:
        self.node = node
        # an earlier life's (the store's copy of this node's state): the record is the node's, not a life's
        self.found: list[Incident] = list(earlier.incidents) if earlier is not None else []
        self.stopped_since: float | None = None
        self._counted: tuple[float, float] | None = None  # the store's outage already in `found`
        self._lock = threading.Lock()  # the beacon's looks run beside its beats (Beacon._look)

    def process(self, state: str, now: float | None = None) -> None:
        """The trainer's process state at a look: a stop is counted once the process runs again (one
        that dies stopped lost its life: that is a restart, not a pause)."""
        now = time.time() if now is None else now
        with self._lock:
            if state == "stopped":
                self.stopped_since = self.stopped_since or now
                return
            # dead (a zombie until its parent reaps it): a life lost while stopped is a restart
            if self.stopped_since is not None and state not in ("gone", "zombie"):
                self._add("paused", self.stopped_since, now)
            self.stopped_since = None

    def store(self, last_outage: tuple[float, float] | None) -> bool:
        """The store's last outage outlasted (runs.store.Store.last_outage), counted once; whether it
        is new."""
        with self._lock:
            if last_outage is None or last_outage == self._counted:
                return False
            self._counted = last_outage
            return self._add("store unreachable", *last_outage)

    def _add(self, kind: IncidentKind, since: float, until: float) -> bool:
        if until - since < MIN_SECONDS:
            return False
        seen = Incident(node=self.node, kind=kind, at=since, seconds=round(until - since, 1))
        self.found = [*self.found, seen]
        return True
