"""A trainer's progress as the rest of the system sees it: status fields, log lines, TensorBoard
scalars (synced to the store), and the throughput figure the metrics keep."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from dlinfra.contract import NodeConfig
from dlinfra.node.checkpoints import log_clock
from dlinfra.node.status import NodeStatus
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import MeanSd

TENSORBOARD_SYNC_SECONDS = 10.0


class Progress:
    """Turns loop progress into status fields, log lines and TensorBoard scalars."""

    def __init__(self, cfg: NodeConfig, store: RunStore, status: NodeStatus, work: Path):
        self.cfg, self.store, self.status = cfg, store, status
        self.first_step_at: float | None = None
        self.last_loss: float | None = None
        self.series: list[tuple[float, int, float]] = []  # (time, step, examples/s)
        self.losses: list[tuple[int, float]] = []  # (step, loss): what a deterministic rerun must repeat
        self.tb_dir = work / "tensorboard"
        self._writer: Any = None
        self._synced = 0.0

    @property
    def writer(self) -> Any:
        if self._writer is None and self.cfg.is_chief:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(str(self.tb_dir))
        return self._writer

    def report(
        self, step: int, loss: float, examples_per_sec: float, input_wait: float | None, **figures: Any
    ) -> None:
        now = time.time()
        if self.first_step_at is None:
            self.first_step_at = now
            self.status.mark("first step", at=now)  # one clock for the metrics and the breakdown
        self.last_loss = loss
        self.series.append((now, step, examples_per_sec))
        self.losses.append((step, loss))
        self.status.update(
            step=step, loss=loss, examples_per_sec=examples_per_sec, input_wait=input_wait, **figures
        )
        waited = "" if input_wait is None else f", {input_wait:.0%} waiting on input"
        print(
            f"{log_clock(now)} step {step}/{self.cfg.training.steps} loss {loss:.4f} "
            f"{examples_per_sec:.0f} examples/s{waited}",
            flush=True,
        )
        if self.writer is not None:
            waits = {} if input_wait is None else {"input_wait": input_wait}
            self._scalars(step, loss=loss, examples_per_sec=examples_per_sec, **waits)
            if now - self._synced > TENSORBOARD_SYNC_SECONDS:
                self.sync()

    def final(self, results: dict[str, float], step: int) -> None:
        if self.writer is not None:
            self._scalars(step, **{f"eval_{name}": value for name, value in results.items()})
            self.sync()

    def _scalars(self, step: int, **values: float) -> None:
        import tensorflow as tf

        with self.writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name, value)

    def sync(self) -> None:
        self.writer.flush()
        self.store.put_tensorboard(self.tb_dir)
        self._synced = time.time()


def mean_sd(rates: list[float], seconds: list[float]) -> MeanSd | None:
    """Each rate weighted by its interval's length: the mean is then work over time."""
    # The first interval includes tracing and warm-up; leave it out when there is more.
    start = 1 if len(rates) > 2 else 0
    pairs = list(zip(rates[start:], seconds[start:], strict=True))
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        return None
    mean = sum(r * w for r, w in pairs) / total
    return MeanSd(mean=mean, sd=math.sqrt(sum(w * (r - mean) ** 2 for r, w in pairs) / total))
