"""A node's local directory mirrored into the run's store: what script mode gives a script in place of
a shared filesystem (its checkpoints, its TensorBoard logs)."""

from __future__ import annotations

import io
import os
import posixpath
import re
import tempfile
import time
from pathlib import Path

from dlinfra.node.checkpoint_state import (
    MAX_STATE_BYTES,
    STATE_FILE,
    CheckpointState,
    family,
    is_state,
    parse_state,
    worth_pulling,
)
from dlinfra.runs.layout import RunStore
from dlinfra.runs.local_files import bounded, check_cap, open_beneath, pid_alive, regular_files

PEEK_SECONDS = 10.0  # how often a node that writes no state file reads the store's (a ps: its shards' fate)
# A restore's file in progress (see _pull_one), by its pid: never the script's, never sent. A life
# killed mid-restore leaves one (bench_chaos seed 743 found it sent into the store as a torn file).
PULLING = re.compile(r"\..+\.(\d+)\.pulling")


class DirectorySync:
    """Mirrors a local directory into a store prefix, as a shared filesystem would hold it.

    A file is sent once it has settled (the same size and mtime at two looks in a row: a checkpoint
    being written is not sent half way, nor sent again at every poll), and TensorFlow's `checkpoint`
    state files go last, only when nothing else is still changing: they name the newest checkpoint,
    whose files are then in the store already. A restore that reads the store thus finds a whole
    checkpoint, the newest one sent. Every node that holds state sends into the same prefix: under
    parameter servers each ps writes its own shards of a checkpoint, and a restore reads the union.

    The store keeps what the script keeps: a checkpoint this node sent leaves the store once a state
    file naming a newer one has landed there and the script removed it (or, for a ps, whose copies
    no script deletes, once the state no longer lists it). A node deletes only files it sent itself,
    never another ps's shards. A file of no checkpoint that the script removed leaves at the end."""

    def __init__(
        self,
        store: RunStore,
        local: Path,
        prefix: str,
        what: str = "",
        cap_gb: float | None = None,
        *,
        sole_sender: bool = True,
    ):
        self.store, self.local, self.prefix = store, local, prefix
        self.what, self.cap_gb = what or prefix, cap_gb
        self.sent: dict[str, tuple[int, int]] = {}
        self.seen: dict[str, tuple[int, int]] = {}
        self.refused: list[str] = []  # links out and special files, each said once (and in the result)
        # What this node may delete: what it sent, and what its earlier lives sent: all the store
        # holds when it is the only sender, else (parameter servers: a restored shard may be
        # another ps's) what its directory held before the restore.
        self.mine: set[str] = set()
        self.sole_sender = sole_sender
        self.landed: dict[str, CheckpointState] = {}  # by folder: the state file this node sent last
        self.peeked: dict[str, tuple[float, CheckpointState | None]] = {}  # by folder: the store's

    @property
    def files(self) -> int:
        return len(self.sent)

    def push(self, *, final: bool = False) -> int:
        """Send what changed and settled (`final`: the writer has exited, everything has settled),
        then remove from the store what the script no longer keeps. Only regular files go
        (runs.local_files); past the cap, OutputsTooBig and nothing more."""
        listing = regular_files(self.local, self.what)
        for line in listing.refused:
            if line not in self.refused:
                print(line, flush=True)
                self.refused.append(line)
        check_cap(listing, self.cap_gb, self.what)
        ready, unsettled = [], False
        for found in listing.files:
            if "_temp" in found.rel or PULLING.fullmatch(posixpath.basename(found.rel)):
                continue  # TensorFlow's half-written shards live under *_temp/ until renamed
            now = (found.size, found.mtime_ns)
            settled = final or self.seen.get(found.rel) == now
            self.seen[found.rel] = now
            if self.sent.get(found.rel) != now:
                unsettled = unsettled or not settled
                if settled:
                    ready.append((found, now))
        state = [item for item in ready if is_state(item[0].rel)]
        ready = [item for item in ready if not is_state(item[0].rel)]
        sent = 0
        for found, now in ready + ([] if unsettled else state):
            fh = open_beneath(self.local, found.source)
            if fh is None:  # deleted meanwhile (a checkpoint manager's max_to_keep), or swapped
                continue
            with fh:
                if is_state(found.rel) and found.size <= MAX_STATE_BYTES:  # read once: judged as sent
                    text = bounded(fh, found.size).read()
                    self.store.put_synced(self.prefix, found.rel, io.BytesIO(text))
                    self.landed[posixpath.dirname(found.rel)] = parse_state(found.rel, text)
                else:
                    self.store.put_synced(self.prefix, found.rel, bounded(fh, found.size))
            self.sent[found.rel] = now
            self.mine.add(found.rel)
            sent += 1
        self._forget({f.rel for f in listing.files}, final)
        return sent

    def _forget(self, present: set[str], final: bool) -> None:
        for rel in sorted(self.mine):
            prefix = family(rel)
            gone = rel not in present
            if prefix is None:
                drop = gone and final
            else:
                folder = posixpath.dirname(rel)
                state = self._state(folder)
                newer = state is not None and state.latest is not None and prefix != state.latest
                # a script keeps what it has not deleted, whatever its state lists (Keras' save_weights
                # lists only the newest); the files of a ps, the state's writer deletes elsewhere
                obsolete = folder not in self.landed and state is not None and state.obsolete(prefix)
                drop = (gone and (newer or final)) or obsolete
            if drop:
                self.store.delete_synced(self.prefix, rel)
                self.mine.discard(rel)
                if gone:
                    self.sent.pop(rel, None)
                    self.seen.pop(rel, None)

    def _state(self, folder: str) -> CheckpointState | None:
        """The newest state file for a folder in the store: the one this node sent, or else (a ps,
        whose shards the chief's state file names) the store's, read again every PEEK_SECONDS."""
        if folder in self.landed:
            return self.landed[folder]
        at, state = self.peeked.get(folder, (0.0, None))
        if time.monotonic() - at > PEEK_SECONDS:
            rel = posixpath.join(folder, STATE_FILE)
            with tempfile.TemporaryDirectory() as scratch:
                state = self._fetch_state(rel, Path(scratch) / STATE_FILE)
            self.peeked[folder] = (time.monotonic(), state)
        return state

    def _fetch_state(self, rel: str, path: Path) -> CheckpointState | None:
        """The store's state file at `rel`, downloaded to `path`; None when not there or too big."""
        if not self.store.get_synced(self.prefix, rel, path) or path.stat().st_size > MAX_STATE_BYTES:
            return None
        return parse_state(rel, path.read_bytes())

    def pull(self) -> int:
        """What a restore needs from the prefix into the local directory (a restarted node's restore):
        the state files and the checkpoints they name as newest, and every file of no checkpoint.
        Each file is written whole under its name, through a temporary name of this process's own, so a
        reader never sees half a file and two nodes restoring into one directory never meet."""
        self._sweep_pulls()
        keys = self.store.synced(self.prefix)
        if self.sole_sender:  # all of it sent by this node's earlier lives, kept or not
            self.mine.update(keys)
        states: dict[str, CheckpointState] = {}
        with tempfile.TemporaryDirectory() as scratch:
            for n, rel in enumerate(filter(is_state, keys)):
                if (state := self._fetch_state(rel, Path(scratch) / str(n))) is not None:
                    states[rel] = state
        got = 0
        real = self.local.resolve()
        for rel in sorted(worth_pulling(keys, states), key=is_state):  # the state files last
            path = self.local / rel
            if not path.parent.resolve().is_relative_to(real):  # an earlier life linked a folder out
                print(f"{self.what}: {rel!r} not restored: its folder is a link out of it", flush=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if self._pull_one(rel, path):
                got += 1
        return got

    def _sweep_pulls(self) -> None:
        """The files of restores killed part way (an earlier life's), not those of one under way."""
        for folder, _, names in os.walk(self.local):  # links not followed: a folder linked out is not ours
            for name in names:
                if (match := PULLING.fullmatch(name)) and not pid_alive(int(match[1])):
                    Path(folder, name).unlink(missing_ok=True)

    def _pull_one(self, rel: str, path: Path) -> bool:
        own = f".{os.getpid()}.pulling"
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=own)
        os.close(handle)
        partial = Path(name)
        here_before = path.exists()  # written or restored by this node's earlier life on this machine
        try:
            if not self.store.get_synced(self.prefix, rel, partial):
                return False
            stat = partial.stat()
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
        self.sent[rel] = self.seen[rel] = (stat.st_size, stat.st_mtime_ns)
        if here_before:
            self.mine.add(rel)
        return True
