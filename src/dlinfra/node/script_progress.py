"""A script's progress, as its node agent learns it: its dlinfra.report calls, else the scalars it
writes for TensorBoard, else (for the stall verdict alone) its CPU use."""

from __future__ import annotations

import os
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
    _cpu: tuple[float, float] | None = None  # (when, CPU seconds) of the last busy check

    def read(self) -> None:
        found = read_report(self.path)
        if found is not None:
            self.source = "report"
        elif self.source != "report" and self.events is not None and self.events.read():
            self.source = "tensorboard"  # without reports: the scalars it writes for TensorBoard
            found = {"step": self.events.step, "scalars": self.events.values, "time": time.time()}
        if found is None or (found["step"] == self.step and found.get("scalars") == self.scalars):
            return
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
        self.status.update(step=self.step, loss=loss, examples_per_sec=rate)

    def busy(self, pid: int) -> None:
        """A script that reports nothing: its CPU use marks progress for the stall verdict."""
        if self.step is not None:
            return
        now, cpu = time.time(), cpu_seconds(pid)
        if cpu is None:
            return
        if self._cpu is None:
            self._cpu = (now, cpu)
        elif now - self._cpu[0] >= BUSY_WINDOW:
            if cpu - self._cpu[1] >= BUSY_CPU_SECONDS:
                self.status.update(progress_at=now)
                if not self.status.fields.get("step"):  # one that reported before: its next report says
                    self.status.training_again(now)
            self._cpu = (now, cpu)


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of a process so far (its reaped children's included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")
