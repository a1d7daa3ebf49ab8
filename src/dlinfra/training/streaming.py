"""Train files streamed through a bounded cache (`training.dataset.cache_gb`): training starts when
a node's first file lands, and files already read are evicted when its share does not fit.

The reader talks to the node agent (Stream, here) through gates and markers on the file system: the
protocol and the reader's side are in training.gates.

The agent fetches ahead of the reader, in the reader's order, as far as the cache allows, several
objects at once. Each example is still read once per epoch: the gates change when a file is read,
never what is read.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from dlinfra.runs.store import Store
from dlinfra.training.gates import (
    ASK,
    ASKED_DIR,
    DONE_DIR,
    GATES_DIR,
    PASSED_DIR,
    READ_PARALLEL,
    TAKEN_LOG,
    WANTED_DIR,
)
from dlinfra.training.shards import ShardFile, ShardManifest
from dlinfra.training.staging import PARALLEL_OBJECTS, TRAIN_DIR, fetch, local_name, size

TICK = 0.02  # seconds between the agent's looks at the reader's markers (a fetch's end wakes it too):
# a reader waits at most this long per file; looking every 5 ms took a fifth of a slow 1-vCPU machine
GB = 10**9
# An ask keeps its file on disk this long at most: its reader may be through the gate and not yet
# have said so (`passed`); a reader TensorFlow dropped while it waited never says so.
PINNED_SECONDS = 60.0
WAIT_REPORTED = 60.0  # seconds a reader waits at a gate before the agent says why


def cache_problem(manifest: ShardManifest, cache_gb: float) -> str | None:
    """A cache too small to stream through: the reader holds READ_PARALLEL files open at once, and
    the agent must fit the next one beside them, or the reader waits on a file that never comes."""
    largest = max(s.bytes for s in manifest.splits["train"].shards)
    need = (READ_PARALLEL + 1) * largest
    if cache_bytes(cache_gb) >= need:
        return None
    decimals = 2 - math.floor(math.log10(need / GB))  # three significant digits, rounded up
    return (
        f"training.dataset.cache_gb: {cache_gb:g} GB cannot stream files of up to {size(largest)}: a "
        f"reader holds {READ_PARALLEL} files at once and the next must fit beside them. Fix: set it to "
        f"{math.ceil(need / GB * 10**decimals) / 10**decimals:g} or more, or split the files smaller"
    )


def cache_bytes(cache_gb: float) -> int:
    return round(cache_gb * GB)


class Stream:
    """The agent's side: serves this node's train files to the reader through `work`'s gates, with at
    most `budget` bytes of them on disk (fetching, or fetched and not yet read to the end). `ordered`:
    the reader reads them in order, pass after pass (gated_records), and the agent fetches ahead in
    that order; else it fetches the files the reader took from the dispatcher (dispatched_records)."""

    def __init__(
        self, store: Store, shards: list[ShardFile], work: Path, budget: int, ordered: bool = True
    ) -> None:
        self.store = store
        self.failed: Callable[[str], None] | None = None  # told why it stopped, before a reader fails
        self.records: str | None = None  # your own TFRecord files' compression: see staging.fetch
        self.ordered = ordered
        self.files = sorted(shards, key=lambda s: local_name(s, "tfrecord"))
        self.files_named = [local_name(s, "tfrecord") for s in self.files]
        self.index = {name: k for k, name in enumerate(self.files_named)}
        self.work = work
        self.budget = budget
        self.evicts = sum(s.bytes for s in shards) > budget  # a share that fits stays for every epoch
        self.largest = max((s.bytes for s in shards), default=0)
        self.present: set[int] = set()
        self.fetching: dict[int, Future[Path]] = {}
        self.reading: collections.Counter[int] = collections.Counter()  # reads past the gate, not done
        self.opened_at: dict[int, int] = {}  # each file's latest gate opening, counted in `opened`
        # unordered: reads the reader has taken and not yet opened, which keep their file on disk
        self.due: collections.Counter[int] = collections.Counter()
        self.hint = 0  # the file the reader will ask for next
        self.wanted: collections.deque[int] = collections.deque()  # taken, not yet fetched (unordered)
        self.held = 0  # bytes of the files present or fetching
        self.fetches = 0
        self.opened = 0  # gates opened: files the reader read (or reads)
        self.peak = 0  # the most bytes on disk at once
        self.error: str | None = None
        self.waits: dict[int, float] = {}  # asked, not yet passed: since when (0: reported)
        self.asks: dict[str, float] = {}  # asks not yet passed (their markers' names): since when
        # files of the asks of the last PINNED_SECONDS: their reader may be through the gate already
        self.pinned: set[int] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=PARALLEL_OBJECTS)
        self._thread = threading.Thread(target=self._serve, name="dlinfra-stream", daemon=True)

    def start(self) -> Stream:
        markers = (GATES_DIR, ASKED_DIR, PASSED_DIR, DONE_DIR, WANTED_DIR)
        for directory in (*markers, TRAIN_DIR):
            (self.work / directory).mkdir(parents=True, exist_ok=True)
        for directory in markers:  # a restarted agent's reader starts over
            for old in (self.work / directory).iterdir():
                old.unlink()
        kept = {p.name for p in (self.work / TRAIN_DIR).iterdir()}
        room = self.budget
        for name, k in self.index.items():
            os.mkfifo(self.work / GATES_DIR / name)
            if name in kept and self.files[k].bytes <= room:  # an earlier life's: fetch() checks it
                room -= self.files[k].bytes
                kept.remove(name)
                self._start_fetch(k)
        for stale in kept:  # another share's, beyond the cache, or a fetch a kill cut short
            (self.work / TRAIN_DIR / stale).unlink()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        print(
            f"data: {self.opened} train files read, {self.fetches} fetched, at most {size(self.peak)} "
            "on disk at once",
            flush=True,
        )

    def _fetch(self, k: int) -> Path:
        try:
            return fetch(self.store, self.files[k], self.work / TRAIN_DIR, "tfrecord", self.records)
        finally:
            self._wake.set()  # a reader may be waiting for it

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(TICK)
            self._wake.clear()
            if self.error is not None:
                self._let_go()
                continue
            try:
                self._tick()
            except Exception as exc:  # said by the agent when its reader fails
                self.error = str(exc)
                print(f"data: streaming stopped: {exc}", flush=True)
                if self.failed is not None:
                    with contextlib.suppress(Exception):  # the readers fail below all the same
                        self.failed(self.error)
                for k in list(self.present):  # so that every reader fails at its next file
                    self._evict(k)

    def _tick(self) -> None:
        if not self.ordered:
            self._take_wanted()
        for marker in _markers(self.work / PASSED_DIR):
            (self.work / ASKED_DIR / marker.name).unlink(missing_ok=True)
            self.asks.pop(marker.name, None)
            if (k := self._file(marker.name)) is not None:
                self._passed(k)
        for marker in _markers(self.work / DONE_DIR):
            if (k := self._file(marker.name)) is None:
                continue
            self.reading[k] -= 1
            if self.reading[k] <= 0:
                del self.reading[k]
            if self.evicts and k not in self.reading and not self.due[k] and k not in self.pinned:
                self._evict(k)
        for k, future in list(self.fetching.items()):
            if future.done():
                future.result()  # a missing or changed file: DataError
                del self.fetching[k]
                self.present.add(k)
        asked = _markers(self.work / ASKED_DIR, remove=False)
        now = time.monotonic()
        young = {m.name for m in asked if now - self.asks.get(m.name, now) < PINNED_SECONDS}
        self.pinned = {k for k in map(self._file, young) if k is not None}
        for marker in asked:
            if (k := self._file(marker.name)) is None:
                continue
            if marker.name not in self.asks:  # a new ask
                self.asks[marker.name] = now
                if self.ordered and k in self.reading:  # before done: a new reader, started over
                    self.reading.clear()
            if not self.ordered and k not in self.reading:
                self._forget_stale_reads()
            # lets through every reader waiting at the gate; each one's `passed` retires its ask
            if k in self.present and _open_gate(self.work / GATES_DIR / self.files_named[k]):
                continue
            if k not in self.present and k not in self.fetching:
                self._make_room(self.files[k].bytes)
                self._start_fetch(k)
            else:
                self._waited(k, self.files_named[k])
        if self.ordered:
            self._fetch_ahead()
        else:
            self._fetch_wanted()
        self.peak = max(self.peak, self.held)

    def _file(self, marker: str) -> int | None:
        return self.index.get(marker.partition(ASK)[0])

    def _passed(self, k: int) -> None:
        """A reader went through file `k`'s gate."""
        self.waits.pop(k, None)
        self.opened += 1
        self.reading[k] += 1
        self.opened_at[k] = self.opened
        if self.due[k]:
            self.due[k] -= 1
        self.hint = (k + 1) % len(self.files)

    def _waited(self, k: int, name: str) -> None:
        """Say once when the reader has waited a minute at a gate: what the agent knows of it (a
        stalled run's logs then tell a missing file from a reader that never came to its gate)."""
        since = self.waits.setdefault(k, time.monotonic())
        if since and time.monotonic() - since > WAIT_REPORTED:
            self.waits[k] = 0.0
            where = "on disk, its reader not at the gate" if k in self.present else "still fetching"
            files = f"reading {sorted(self.reading)}, due {sorted(+self.due)}, fetching {list(self.fetching)}"
            print(
                f"data: {name} asked for {WAIT_REPORTED:.0f}s and not opened: {where}; files (by number) "
                f"{files}; {size(self.held)} of {size(self.budget)} held",
                flush=True,
            )

    def _forget_stale_reads(self) -> None:
        """Before the reader opens another file: it reads READ_PARALLEL at once and writes each one's
        `done` before it asks for the next, so reads beyond the latest READ_PARALLEL - 1 opened belong
        to a reader TensorFlow dropped (the data service's first task, a dataset it rebuilt). Kept,
        they would hold their files on disk for the rest of the run."""
        stale = sorted(self.reading, key=self.opened_at.__getitem__)[
            : max(0, len(self.reading) - READ_PARALLEL + 1)
        ]
        for k in stale:
            del self.reading[k]
            if self.evicts and not self.due[k]:
                self._evict(k)

    def _take_wanted(self) -> None:
        """Note the files the reader took from the dispatcher: before its asks are read, as it wrote
        each `wanted` marker before it asked for that file."""
        taken = sorted(_markers(self.work / WANTED_DIR), key=_taken_order)
        if not taken:
            return
        with (self.work / TAKEN_LOG).open("a") as log:  # what this node read, pass by pass
            log.writelines(f"{p}\t{name}\n" for p, name in map(_taken_order, taken))
        for k in (self.index.get(name) for _, name in map(_taken_order, taken)):
            if k is not None:
                self.wanted.append(k)
                self.due[k] += 1

    def _fetch_wanted(self) -> None:
        """Fetch the files the reader took and will open next, in the order it took them, as far as
        the cache allows (a file it asks for first is fetched by the asked path)."""
        while self.wanted and len(self.fetching) < PARALLEL_OBJECTS:
            k = self.wanted[0]
            if k in self.present or k in self.fetching or not self.due[k]:  # here, or read already
                self.wanted.popleft()
            # room kept for the file the reader asks for next, which may not be the one taken first:
            # a file fetched ahead can be evicted for an ask before its turn, and fetched at its ask
            elif self.held + self.files[k].bytes + self.largest <= self.budget:
                self._start_fetch(self.wanted.popleft())
            else:
                return  # fetched when there is room, or when the reader asks

    def _fetch_ahead(self) -> None:
        if len(self.present) + len(self.fetching) == len(self.files):
            return
        for step in range(len(self.files)):
            k = (self.hint + step) % len(self.files)
            if k in self.present or k in self.fetching:
                continue
            if len(self.fetching) >= PARALLEL_OBJECTS or self.held + self.files[k].bytes > self.budget:
                return
            self._start_fetch(k)

    def _start_fetch(self, k: int) -> None:
        self.fetches += 1
        self.held += self.files[k].bytes
        self.fetching[k] = self._pool.submit(self._fetch, k)

    def _make_room(self, wanted: int) -> None:
        """Evict files fetched ahead and not being read, until `wanted` more bytes fit: first those
        no reader has taken, the farthest from the reader first (after a reader started over, what it
        will read first comes first)."""
        ahead = sorted(
            self.present - self.reading.keys() - self.pinned,
            key=lambda k: (not self.due[k], (k - self.hint) % len(self.files)),
        )
        while ahead and self.held + wanted > self.budget:
            self._evict(ahead.pop())

    def _evict(self, k: int) -> None:
        if k not in self.present:
            return
        self.present.discard(k)
        self.held -= self.files[k].bytes
        with contextlib.suppress(FileNotFoundError):
            (self.work / TRAIN_DIR / local_name(self.files[k], "tfrecord")).unlink()

    def _let_go(self) -> None:
        """Open every gate a reader waits on: with no file behind it, the reader fails."""
        for marker in _markers(self.work / ASKED_DIR, remove=False):
            if _open_gate(self.work / GATES_DIR / marker.name.partition(ASK)[0]):
                marker.unlink()


def _taken_order(marker: Path) -> tuple[int, str]:
    """A `wanted/<pass>-<file>` marker's pass and file."""
    pass_number, _, name = marker.name.partition("-")
    return int(pass_number), name


def _markers(directory: Path, remove: bool = True) -> list[Path]:
    found = sorted(directory.iterdir())
    if remove:
        for path in found:
            path.unlink()
    return found


def _open_gate(gate: Path) -> bool:
    """Let the reader waiting on `gate` through: False when no reader has it open yet."""
    try:
        os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: nobody at the other end yet
        return False
    return True
