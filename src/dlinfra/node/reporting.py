"""A trainer's progress as the rest of the system sees it: status fields, log lines, TensorBoard
scalars (synced to the store), and the throughput figure the metrics keep.

The training thread only records a report (a few list appends) and hands it over: between two
training calls the devices wait for the Python in between (bench/bench_loop_costs.py, +status and
+tensorboard), and under parameter servers the coordinator's own Python threads dispatch the calls.
A publisher thread writes the log line and the scalars of every report while the next call runs, and
the status file with the newest fields at most once a second; the event files go to the store from a
thread of their own, so a store outage delays neither training nor the status file the beacon judges
stalls by."""

from __future__ import annotations

import math
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dlinfra.contract import NodeConfig
from dlinfra.node.checkpoints import log_clock
from dlinfra.node.events import ScalarWriter
from dlinfra.node.status import NodeStatus
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import MeanSd

TENSORBOARD_SYNC_SECONDS = 10.0
# The status file at most once a second: the beacon reads it every heartbeat, and a report every few
# milliseconds would rewrite it hundreds of times between two reads.
STATUS_EVERY = 1.0
SPREAD_WINDOW = 1.0  # seconds: throughput's spread is over spans at least this long (mean_sd)


@dataclass(frozen=True)
class Report:
    at: float
    step: int
    loss: float
    examples_per_sec: float
    input_wait: float | None
    first: bool  # this life's first step
    figures: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """What the node's status says of it."""
        waits = {"examples_per_sec": self.examples_per_sec, "input_wait": self.input_wait}
        return {"step": self.step, "loss": self.loss, **waits, **self.figures}


class Progress:
    """Turns loop progress into status fields, log lines and TensorBoard scalars, off the training
    thread. `close()` publishes what is still pending; the loop's end calls it before the node's last
    word, so nothing a report said lands after it."""

    def __init__(
        self, cfg: NodeConfig, store: RunStore, status: NodeStatus, work: Path, log: TextIO | None = None
    ):
        self.cfg, self.store, self.status = cfg, store, status
        self.log = log  # None: the process's stdout, the node's log
        self.first_step_at: float | None = None
        self.last_loss: float | None = None
        self.series: list[tuple[float, int, float]] = []  # (time, step, examples/s)
        self.losses: list[tuple[int, float]] = []  # (step, loss): what a deterministic rerun must repeat
        self.tb_dir = work / "tensorboard"
        self._writer: ScalarWriter | None = None
        self._synced = 0.0  # the first report syncs: TensorBoard shows a run from its start
        self._pending: queue.SimpleQueue[Report | None] = queue.SimpleQueue()
        self._publisher: threading.Thread | None = None
        self._sync_due = threading.Event()
        self._syncer: threading.Thread | None = None
        self._syncing = threading.Lock()  # the syncer's uploads and the final one never overlap

    @property
    def writer(self) -> ScalarWriter | None:
        if self._writer is None and self.cfg.is_chief:
            self._writer = ScalarWriter(self.tb_dir)
        return self._writer

    def report(
        self, step: int, loss: float, examples_per_sec: float, input_wait: float | None, **figures: Any
    ) -> None:
        """On the training thread: what the metrics keep is recorded here, the rest is handed over."""
        now = time.time()
        first = self.first_step_at is None
        if first:
            self.first_step_at = now
        self.last_loss = loss
        self.series.append((now, step, examples_per_sec))
        self.losses.append((step, loss))
        if self._publisher is None:
            self._publisher = threading.Thread(target=self._publish_all, name="progress", daemon=True)
            self._publisher.start()
        self._pending.put(Report(now, step, loss, examples_per_sec, input_wait, first, figures))

    def close(self) -> None:
        """Publishes every report handed over so far (idempotent)."""
        if self._publisher is not None:
            self._pending.put(None)
            self._publisher.join()
            self._publisher = None

    def final(self, results: dict[str, float], step: int) -> None:
        self.close()
        if self.writer is not None:
            self.writer.write(step, time.time(), {f"eval_{name}": value for name, value in results.items()})
            self.sync()

    def _publish_all(self) -> None:
        unwritten: dict[str, Any] = {}  # status fields of reports the file does not hold yet
        due = 0.0  # when the status file may be written again
        while True:
            wait = None if not unwritten else max(0.0, due - time.monotonic())
            try:
                if (report := self._pending.get(timeout=wait)) is None:
                    break
                unwritten |= report.fields()
                self._guarded(self._publish, report)
            except queue.Empty:  # a second since the last write: the newest fields go in now
                pass
            if unwritten and time.monotonic() >= due:
                self._guarded(self.status.update, **unwritten)
                unwritten, due = {}, time.monotonic() + STATUS_EVERY
        if unwritten:
            self._guarded(self.status.update, **unwritten)

    def _guarded(self, publish: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            publish(*args, **kwargs)
        except Exception as exc:  # a full disk must not end training: the metrics keep the figures
            self._say(f"could not publish progress: {exc}")

    def _publish(self, r: Report) -> None:
        """The report's log line and scalars."""
        if r.first:
            self.status.mark("first step", at=r.at)  # one clock for the metrics and the breakdown
        waited = "" if r.input_wait is None else f", {r.input_wait:.0%} waiting on input"
        self._say(
            f"{log_clock(r.at)} step {r.step}/{self.cfg.training.steps} loss {r.loss:.4f} "
            f"{r.examples_per_sec:.0f} examples/s{waited}"
        )
        if self.writer is not None:
            waits = {} if r.input_wait is None else {"input_wait": r.input_wait}
            self.writer.write(r.step, r.at, {"loss": r.loss, "examples_per_sec": r.examples_per_sec} | waits)
            if r.at - self._synced > TENSORBOARD_SYNC_SECONDS:
                self._synced = r.at
                self._sync_soon()

    def _say(self, line: str) -> None:
        print(line, file=self.log or sys.stdout, flush=True)

    def _sync_soon(self) -> None:
        if self._syncer is None:
            self._syncer = threading.Thread(target=self._sync_when_due, name="tensorboard-sync", daemon=True)
            self._syncer.start()
        self._sync_due.set()

    def _sync_when_due(self) -> None:
        while self._sync_due.wait():
            self._sync_due.clear()
            try:
                self.sync()
            except Exception as exc:  # TensorBoard is a view: the next sync, or the final one, catches up
                self._say(f"could not copy TensorBoard's event files to the store: {exc}")

    def sync(self) -> None:
        with self._syncing:
            if self.writer is not None:
                self.writer.flush()
                self.store.put_tensorboard(self.tb_dir)


def mean_sd(rates: list[float], seconds: list[float]) -> MeanSd | None:
    """Each rate weighted by its interval's length: the mean is then work over time. The spread is
    over windows of at least SPREAD_WINDOW seconds of consecutive intervals: parameter-server chunks
    come back in bunches, and one 0.1 ms interval between two of them read as 10^5 steps/s, which
    made a steady run's spread three times its mean (`8411 ± 28924` examples/s, measured)."""
    # The first interval includes tracing and warm-up; leave it out when there is more.
    start = 1 if len(rates) > 2 else 0
    pairs = list(zip(rates[start:], seconds[start:], strict=True))
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        return None
    mean = sum(r * w for r, w in pairs) / total
    windows = _windows(pairs)
    return MeanSd(mean=mean, sd=math.sqrt(sum(w * (r - mean) ** 2 for r, w in windows) / total))


def _windows(pairs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(rate, seconds) of consecutive intervals merged into spans of at least SPREAD_WINDOW seconds;
    a shorter rest joins the last span."""
    spans: list[tuple[float, float]] = []  # (work, seconds)
    work = span = 0.0
    for rate, seconds in pairs:
        work, span = work + rate * seconds, span + seconds
        if span >= SPREAD_WINDOW:
            spans.append((work, span))
            work = span = 0.0
    if span > 0:
        if spans:
            last_work, last_span = spans.pop()
            work, span = work + last_work, span + last_span
        spans.append((work, span))
    return [(w / s, s) for w, s in spans if s > 0]
