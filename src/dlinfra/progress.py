"""`dlinfra.report(step, **scalars)`: a training script's one line to tell dlinfra how far it is.

Under dlinfra (script mode) it writes the newest report to a small file its node agent reads: the
step and scalars then show in `dlinfra status`, the result table and metrics.json, and the stall
verdict counts from the last step reported. Anywhere else it does nothing, so a script keeps the
call when it runs by hand. It imports nothing heavy and writes at most every half second (the
newest report of a burst is kept and written at the next call or at exit), so calling it every
step costs microseconds.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import stat
import time
from pathlib import Path
from typing import Any

PROGRESS_FILE = "DLINFRA_PROGRESS_FILE"  # set by the node agent for the script it runs
MIN_INTERVAL = 0.5
MAX_REPORT_BYTES = 1_000_000  # a step and its scalars; more is not a report


class _Reporter:
    def __init__(self) -> None:
        self.written_at = 0.0
        self.pending: tuple[int, dict[str, Any], float] | None = None
        self.hooked = False

    def report(self, step: int, scalars: dict[str, Any]) -> None:
        path = os.environ.get(PROGRESS_FILE)
        if not path:
            return
        self.pending = (int(step), scalars, time.time())
        if not self.hooked:
            atexit.register(self.flush)
            self.hooked = True
        if time.monotonic() - self.written_at >= MIN_INTERVAL:
            self.flush()

    def flush(self) -> None:
        path = os.environ.get(PROGRESS_FILE)
        if not path or self.pending is None:
            return
        step, scalars, at = self.pending
        self.pending = None
        self.written_at = time.monotonic()
        values = {}
        for name, value in scalars.items():
            number = float(value)  # a NumPy or TensorFlow scalar reads as a float here, not per call
            values[str(name)] = number if math.isfinite(number) else None
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"step": step, "time": at, "scalars": values}), encoding="utf-8")
        tmp.replace(target)  # the agent never reads half a report


_reporter = _Reporter()


def report(step: int, **scalars: Any) -> None:
    """Report the global step the script has reached and any scalars (loss, accuracy, examples_per_sec,
    ...). A no-op outside a dlinfra run. Call it from one process per node, e.g. the chief."""
    _reporter.report(step, scalars)


def read_report(path: Path) -> dict[str, Any] | None:
    """The newest report a script wrote (the agent's side), or None. The script owns the file: a link
    there is not followed, a FIFO not waited on, and no more than a report's size is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = fh.read(MAX_REPORT_BYTES + 1)
    if len(data) > MAX_REPORT_BYTES:
        return None
    try:
        found = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    return found if isinstance(found, dict) and isinstance(found.get("step"), int) else None
