"""A script's progress, as its node agent learns it: its dlinfra.report calls, else the scalars it
writes for TensorBoard, else (for the stall verdict alone) its CPU use.

A script that reports (dlinfra.report) is stalled sooner than cluster.stall_timeout: after
STALL_MULTIPLE times the median interval between its new steps, never under STALL_FLOOR (TensorFlow's
tracing, a checkpoint or an evaluation pause a healthy script), and never under twice the longest
pause it has already made and come back from. The node publishes that bound (stall_after); the
watcher takes the run's from it (runs.diagnosis.stall_limit).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dlinfra.node.events import EventScalars
from dlinfra.node.status import NodeStatus
from dlinfra.progress import read_report

# Without reports, the script's CPU time stands in for progress: a script waiting forever (on a peer
# that never comes, on a lock) uses next to none; one that trains uses a core.
BUSY_CPU_SECONDS = 0.5
BUSY_WINDOW = 10.0
STALL_MULTIPLE = 10.0
STALL_FLOOR = 30.0
STALL_INTERVALS = 3  # intervals seen before the script's own pace counts (a median of one is noise)
KEPT_REPORT_TIMES = 50


@dataclass
class ScriptProgress:
    """What the script reported (dlinfra.report), turned into status fields and the run's series."""

    status: NodeStatus
    path: Path
    events: EventScalars | None = None  # the owner's TensorBoard directory, read without reports
    source: Literal["report", "tensorboard"] | None = None
    step: int | None = None
    scalars: dict[str, float | None] = field(default_factory=dict)
    first_step_at: float | None = None
    series: list[tuple[float, int, float]] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)
    report_times: list[float] = field(default_factory=list)  # when each new step was reported, latest last
    longest_pause: float = 0.0
    _cpu: tuple[float, float] | None = None  # (when, CPU seconds) of the last busy check

    @property
    def last_step(self) -> int | None:
        """The step the script reached: this life's report, else an earlier life's (a restart that
        restored the final checkpoint has nothing left to train, and reports nothing)."""
        if self.step is not None:
            return self.step
        return int(self.status.fields.get("step") or 0) or None

    def read(self) -> None:
        found = read_report(self.path)
        if found is not None:
            self.source = "report"
        elif self.source != "report" and self.events is not None and self.events.read():
            self.source = "tensorboard"  # without reports: the scalars it writes for TensorBoard
            found = {"step": self.events.step, "scalars": self.events.values, "time": time.time()}
        if found is None or (found["step"] == self.step and found.get("scalars") == self.scalars):
            return
        # only a new step moves the stall clock; only reports pace it (event files are flushed
        # on TensorFlow's own schedule, not the script's)
        pace = found["step"] != self.step and self.source == "report"
        self.step, self.scalars = found["step"], dict(found.get("scalars") or {})
        at = float(found.get("time") or time.time())
        if self.first_step_at is None:
            self.first_step_at = at
            self.status.training_again(at, self.step)  # a restart's first report: where it resumed
            self.status.mark("first step", at=at)
        loss, rate = self.scalars.get("loss"), self.scalars.get("examples_per_sec")
        if loss is not None and (not self.losses or self.losses[-1][0] != self.step):
            self.losses.append((self.step, loss))
        if rate is not None:
            self.series.append((at, self.step, rate))
        self.status.update(
            step=self.step, loss=loss, examples_per_sec=rate, **(self._paced(at) if pace else {})
        )

    def _paced(self, at: float) -> dict[str, float]:
        """The stall bound this script's own pace sets, once it has one: {"stall_after": seconds}."""
        if self.report_times:
            self.longest_pause = max(self.longest_pause, at - self.report_times[-1])
        self.report_times = [*self.report_times, at][-KEPT_REPORT_TIMES:]
        intervals = [b - a for a, b in zip(self.report_times, self.report_times[1:], strict=False)]
        if len(intervals) < STALL_INTERVALS:
            return {}
        return {"stall_after": stall_after(intervals, self.longest_pause)}

    def busy(self, pid: int) -> None:
        """A script's CPU use: for one that reports nothing, it marks progress for the stall verdict;
        for one that reports, it shows work between reports (the pace's bound waits for it)."""
        now, cpu = time.time(), cpu_seconds(pid)
        if cpu is None:
            return
        if self._cpu is None:
            self._cpu = (now, cpu)
        elif now - self._cpu[0] >= BUSY_WINDOW:
            used, window = cpu - self._cpu[1], now - self._cpu[0]
            self._cpu = (now, cpu)
            if self.step is not None:
                if used >= BUSY_CPU_SECONDS:
                    self.status.update(working_at=now)
                return
            # its share of one core, shown where a reporting script shows its step
            shown = {"cpu_percent": round(100 * used / window)}
            self.status.update(**shown, **({"progress_at": now} if used >= BUSY_CPU_SECONDS else {}))
            if used >= BUSY_CPU_SECONDS and not self.status.fields.get("step"):
                self.status.training_again(now)  # one that reported before: its next report says


def carry_last_report(status: NodeStatus, path: Path) -> None:
    """Before a new life clears it: the step of the last report the life before left on this machine,
    when it is past what its agent read. That life ended (a kill, a restart with its cluster) before
    its agent's next read; a new life that restores the final checkpoint trains nothing and reports
    nothing, so the run's steps are this one's (a spot test, under load, saw the MWMS guide's DONE
    run say 229 of its 300 steps)."""
    left = read_report(path)
    if left is not None and left["step"] > int(status.fields.get("step") or 0):
        status.update(step=left["step"])


def stall_after(intervals: list[float], longest_pause: float = 0.0) -> float:
    """Seconds without a new report after which a script reporting at these intervals is stalled."""
    return max(STALL_FLOOR, STALL_MULTIPLE * statistics.median(intervals), 2 * longest_pause)


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of a process so far (its reaped children's included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")
