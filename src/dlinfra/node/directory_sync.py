"""A node's local directory mirrored into the run's store: what script mode gives a script in place of
a shared filesystem (its checkpoints, its TensorBoard logs)."""

from __future__ import annotations

from pathlib import Path

from dlinfra.runs.layout import RunStore


class DirectorySync:
    """Mirrors a local directory into a store prefix, as a shared filesystem would hold it.

    A file is sent once it has settled (the same size and mtime at two looks in a row: a checkpoint
    being written is not sent half way, nor sent again at every poll), and TensorFlow's `checkpoint`
    state files go last, only when nothing else is still changing: they name the newest checkpoint,
    whose files are then in the store already. A restore that reads the store thus finds a whole
    checkpoint, the newest one sent. Every node that holds state sends into the same prefix: under
    parameter servers each ps writes its own shards of a checkpoint, and a restore reads the union."""

    def __init__(self, store: RunStore, local: Path, prefix: str):
        self.store, self.local, self.prefix = store, local, prefix
        self.sent: dict[str, tuple[int, int]] = {}
        self.seen: dict[str, tuple[int, int]] = {}

    @property
    def files(self) -> int:
        return len(self.sent)

    def push(self, *, final: bool = False) -> int:
        """Send what changed and settled (`final`: the writer has exited, everything has settled)."""
        ready, unsettled = [], False
        for path in sorted(self.local.rglob("*")):
            rel = path.relative_to(self.local).as_posix()
            if "_temp" in rel or not path.is_file():
                continue  # TensorFlow's half-written shards live under *_temp/ until renamed
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            now = (stat.st_size, stat.st_mtime_ns)
            settled = final or self.seen.get(rel) == now
            self.seen[rel] = now
            if self.sent.get(rel) != now:
                unsettled = unsettled or not settled
                if settled:
                    ready.append((rel, path, now))
        state = [item for item in ready if Path(item[0]).name == "checkpoint"]
        ready = [item for item in ready if Path(item[0]).name != "checkpoint"]
        sent = 0
        for rel, path, now in ready + ([] if unsettled else state):
            try:
                self.store.put_synced(self.prefix, rel, path)
            except FileNotFoundError:  # deleted meanwhile (a checkpoint manager's max_to_keep)
                continue
            self.sent[rel] = now
            sent += 1
        return sent

    def pull(self) -> int:
        """Every file of the prefix into the local directory (a restarted node's restore), each
        written whole under its name (a process reading the directory never sees half a file)."""
        got = 0
        for rel in self.store.synced(self.prefix):
            path = self.local / rel
            partial = path.with_name(f".{path.name}.pulling")
            if self.store.get_synced(self.prefix, rel, partial):
                partial.replace(path)
                stat = path.stat()
                self.sent[rel] = self.seen[rel] = (stat.st_size, stat.st_mtime_ns)
                got += 1
        return got
