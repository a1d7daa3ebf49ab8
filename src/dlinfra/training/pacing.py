"""How the parameter-server chief paces remote work: steps per remote call, and calls kept queued.

Both follow what the chief measures (the times of the last few chunks it fetched), so neither a
digits step of a few ms nor a ResNet-20 step of over 100 ms needs hand tuning. Figures from
bench/bench_anchors.py and bench/bench_training.py on the 2-core development machine (BENCHMARKS.md).
"""

from __future__ import annotations

import collections
import math
from typing import Any, Literal

# A chunk is `log_every` steps, split into remote calls; the chief keeps about QUEUED_SECONDS of work
# scheduled behind the chunk it waits on. Two chunks left a digits worker (6 ms steps) idle 16 % of
# the time on the chief's fetch and report.
QUEUED_SECONDS = 1.0
MIN_QUEUED_CHUNKS, MAX_QUEUED_CHUNKS = 2, 8

# A remote call costs a dispatch on top of its steps, and the dispatch grows with the model: 8 ms for
# the digits CNN (18.9 ms per step at 1 step per call, 10.7 ms at 50), 29 ms for ResNet-20 (181 ms
# per step at 1 per call, 155 ms at 10; bench_anchors, where `auto` aiming at 0.25 s chose 1 step
# and lost 15 % to the fixed 10). A call of about CALL_SECONDS keeps either under 1.5 % (where
# log_every allows a call that long). At 1 s, workers that share a machine's cores (three ResNet-20
# workers on two: 0.5 s a step each) were given 1-2 steps a call and lost 4-9 % to the fixed 10
# (bench_anchors). Longer calls buy little more and lengthen what a lost worker re-runs and what a
# spot notice's checkpoint waits for.
CALL_SECONDS = 2.0
# Before any chunk was timed: `auto` starts at one step and grows. Each estimate includes the dispatch
# of small calls, so it approaches from below rather than overshooting.
AUTO_FIRST_CALL = 1


def steps_per_call(configured: int | Literal["auto"], step_seconds: float | None, log_every: int) -> int:
    """Steps in one remote call: as configured, or (`auto`) about CALL_SECONDS of one worker's
    compute at `step_seconds` (None: not measured yet). Never more than a chunk (`log_every`): the
    chief reports once per chunk, as often as the experiment asks."""
    if configured != "auto":
        return max(1, min(configured, log_every))
    if step_seconds is None:
        return min(AUTO_FIRST_CALL, log_every)
    return max(1, min(log_every, round(CALL_SECONDS / max(step_seconds, 1e-6))))


class ChunkClock:
    """Times the chunks the chief fetches, over the last few: with several workers, chunks finish in
    bunches (one per worker at nearly the same moment), so a single interval swings between almost
    nothing and several chunks' worth, and `auto` would swing with it (seen: 20, 10, 20, 11, ...)."""

    def __init__(self, workers: int, now: float):
        self.workers = workers
        self._steps = 0
        self._traced = False
        self._marks: collections.deque[tuple[float, int]] = collections.deque(maxlen=max(2, workers) + 1)
        self.restart(now)

    def restart(self, now: float) -> None:
        """After a pause that is not training (the drain and save at a checkpoint)."""
        self._marks.clear()
        self._marks.append((now, self._steps))

    def fetched(self, now: float, steps: int) -> tuple[float, float]:
        """A chunk of `steps` arrived: (seconds per chunk, one worker's seconds per step), over the
        window. With work queued for every worker they run side by side, so S steps take S x step /
        workers; the dispatch of each call is inside the figure."""
        self._steps += steps
        self._marks.append((now, self._steps))
        (then, before), chunks = self._marks[0], len(self._marks) - 1
        elapsed = now - then
        figures = elapsed / chunks, elapsed * self.workers / max(self._steps - before, 1)
        if not self._traced:
            # The first chunk held every worker's trace of the step function (seconds, for a ResNet):
            # it starts the window instead of staying in it. Kept in (with calls of 1 s), three
            # ResNet-20 workers ran 100 of their 120 steps at one step a call (bench_anchors).
            self._traced = True
            self.restart(now)
        return figures


def queue_depth(chunk_seconds: float, workers: int, calls_per_chunk: int) -> int:
    """Chunks to keep scheduled ahead, from a chunk's recent duration (ChunkClock); never fewer than
    two remote calls per worker (one running, one waiting), or workers would idle."""
    floor = max(MIN_QUEUED_CHUNKS, math.ceil(2 * workers / calls_per_chunk))
    wanted = math.ceil(QUEUED_SECONDS / max(chunk_seconds, 1e-3))
    return max(floor, min(MAX_QUEUED_CHUNKS, wanted))


class WorkerSamples:
    """Under parameter servers, each worker's seconds per step over its last few progress reports,
    from the tally its calls keep on the ps ([steps, seconds] per worker): what the watcher names a
    straggler by (runs.stragglers), and each worker's steps, its share of the updates."""

    def __init__(self, keep: int = 4):
        self._totals: collections.deque[Any] = collections.deque(maxlen=keep + 1)
        self._last: dict[str, float] = {}

    def read(self, totals: Any) -> dict[str, list[float]]:
        """worker → [seconds per step over the window, steps in this life]; a worker without a call
        ended in the window keeps its last figure (one in a long call is slow once that call ends)."""
        self._totals.append(totals)
        first, last = self._totals[0], self._totals[-1]
        for i, (steps, seconds) in enumerate(last):
            done = steps - (first[i][0] if len(self._totals) > 1 else 0)
            spent = seconds - (first[i][1] if len(self._totals) > 1 else 0)
            if done > 0:
                self._last[f"worker-{i}"] = round(spent / done, 6)
        return {w: [s, float(last[int(w.rpartition("-")[2])][0])] for w, s in sorted(self._last.items())}
