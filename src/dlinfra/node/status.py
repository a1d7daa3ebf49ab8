"""What a node tells the world through the store: heartbeats and progress."""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from dlinfra.layout import RunStore
from dlinfra.records import NodeState


class NodeStatus:
    """Publishes status/<node>.json every `interval` seconds from a daemon thread, and the node's
    log file to logs/<node>.log, so a watcher sees progress and a dead node goes quiet."""

    def __init__(
        self, store: RunStore, node: str, role: str, index: int, interval: float, log_file: Path | None
    ):
        self.store, self.node, self.interval, self.log_file = store, node, interval, log_file
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._log_size = -1
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
            "restarts": previous.restarts + 1 if previous else 0,  # left by an earlier life: a restart
            "started": now,
            "first_started": previous.first_started if previous else now,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "error": None,
        }
        self._thread = threading.Thread(target=self._beat, name="dlinfra-heartbeat", daemon=True)

    @property
    def restarts(self) -> int:
        return int(self.fields["restarts"])

    @property
    def first_started(self) -> float:
        return float(self.fields["first_started"])

    def start(self) -> NodeStatus:
        self.publish()
        self._thread.start()
        return self

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.fields.update(fields)

    def publish(self) -> None:
        with self._lock:
            state = NodeState(**self.fields, heartbeat=time.time())
        try:
            self.store.put_status(state)
            self._sync_log()
        except Exception:  # a store outage must not kill training; the next beat retries
            traceback.print_exc()

    def _sync_log(self) -> None:
        if self.log_file is None or not self.log_file.exists():
            return
        size = self.log_file.stat().st_size
        if size != self._log_size:
            self.store.put_log(self.node, self.log_file)
            self._log_size = size

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self.publish()

    def stop(self, **final: Any) -> None:
        self._stop.set()
        self.update(**final)
        self.publish()
