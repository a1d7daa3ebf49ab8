"""A node's local directory mirrored into the run's store: what script mode gives a script in place of
a shared filesystem (its checkpoints, its TensorBoard logs)."""

from __future__ import annotations

from pathlib import Path

from dlinfra.runs.layout import RunStore
from dlinfra.runs.local_files import bounded, check_cap, open_beneath, regular_files


class DirectorySync:
    """Mirrors a local directory into a store prefix, as a shared filesystem would hold it.

    A file is sent once it has settled (the same size and mtime at two looks in a row: a checkpoint
    being written is not sent half way, nor sent again at every poll), and TensorFlow's `checkpoint`
    state files go last, only when nothing else is still changing: they name the newest checkpoint,
    whose files are then in the store already. A restore that reads the store thus finds a whole
    checkpoint, the newest one sent. Every node that holds state sends into the same prefix: under
    parameter servers each ps writes its own shards of a checkpoint, and a restore reads the union."""

    def __init__(
        self, store: RunStore, local: Path, prefix: str, what: str = "", cap_gb: float | None = None
    ):
        self.store, self.local, self.prefix = store, local, prefix
        self.what, self.cap_gb = what or prefix, cap_gb
        self.sent: dict[str, tuple[int, int]] = {}
        self.seen: dict[str, tuple[int, int]] = {}
        self.refused: list[str] = []  # links out and special files, each said once (and in the result)

    @property
    def files(self) -> int:
        return len(self.sent)

    def push(self, *, final: bool = False) -> int:
        """Send what changed and settled (`final`: the writer has exited, everything has settled).
        Only regular files go (runs.local_files); past the cap, OutputsTooBig and nothing more."""
        listing = regular_files(self.local, self.what)
        for line in listing.refused:
            if line not in self.refused:
                print(line, flush=True)
                self.refused.append(line)
        check_cap(listing, self.cap_gb, self.what)
        ready, unsettled = [], False
        for found in listing.files:
            if "_temp" in found.rel:
                continue  # TensorFlow's half-written shards live under *_temp/ until renamed
            now = (found.size, found.mtime_ns)
            settled = final or self.seen.get(found.rel) == now
            self.seen[found.rel] = now
            if self.sent.get(found.rel) != now:
                unsettled = unsettled or not settled
                if settled:
                    ready.append((found, now))
        state = [item for item in ready if Path(item[0].rel).name == "checkpoint"]
        ready = [item for item in ready if Path(item[0].rel).name != "checkpoint"]
        sent = 0
        for found, now in ready + ([] if unsettled else state):
            fh = open_beneath(self.local, found.source)
            if fh is None:  # deleted meanwhile (a checkpoint manager's max_to_keep), or swapped
                continue
            with fh:
                self.store.put_synced(self.prefix, found.rel, bounded(fh, found.size))
            self.sent[found.rel] = now
            sent += 1
        return sent

    def pull(self) -> int:
        """Every file of the prefix into the local directory (a restarted node's restore), each
        written whole under its name (a process reading the directory never sees half a file)."""
        got = 0
        real = self.local.resolve()
        for rel in self.store.synced(self.prefix):
            path = self.local / rel
            if not path.parent.resolve().is_relative_to(real):  # an earlier life linked a folder out
                print(f"{self.what}: {rel!r} not restored: its folder is a link out of it", flush=True)
                continue
            partial = path.with_name(f".{path.name}.pulling")
            if self.store.get_synced(self.prefix, rel, partial):
                partial.replace(path)
                stat = path.stat()
                self.sent[rel] = self.seen[rel] = (stat.st_size, stat.st_mtime_ns)
                got += 1
        return got
