"""A trainer's checkpoints between its local disk and the run's store."""

from __future__ import annotations

import time
from pathlib import Path

from dlinfra.runs.layout import RunStore


def log_clock(t: float) -> str:
    """UTC wall time with milliseconds: log lines of different nodes and lives line up."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class CheckpointSync:
    """Checkpoints go to local disk (TF has no s3:// filesystem) and then to the store, files first
    and the pointer naming them last: a reader never sees a partial checkpoint."""

    def __init__(self, store: RunStore, work: Path):
        self.store, self.work = store, work
        self.latest_uri: str | None = None
        self.restored_step: int | None = None

    def upload(self, step: int, directory: Path) -> None:
        pointer = self.store.put_checkpoint(step, directory)
        self.latest_uri = self.store.checkpoint_uri(pointer.prefix)
        print(
            f"{log_clock(time.time())} checkpoint {pointer.prefix} stored ({len(pointer.files)} files)",
            flush=True,
        )

    def download_latest(self) -> Path | None:
        pointer = self.store.latest_checkpoint()
        if pointer is None:
            return None
        local = self.work / "restore" / pointer.prefix  # one dir per checkpoint: no stale files
        if not self.store.get_checkpoint(pointer, local):
            return None
        self.restored_step = pointer.step
        print(
            f"{log_clock(time.time())} resuming from checkpoint {pointer.prefix} (step {pointer.step})",
            flush=True,
        )
        return local / pointer.prefix
