"""Stragglers while a run trains: a worker whose seconds per step stay above `cluster.straggler.ratio`
times its peers' median for `cluster.straggler.window` seconds is named, with its figures.

The figures are the nodes' own (NodeState): under multi_worker_mirrored each worker's own forward and
backward pass per step, without the all-reduce, where every worker waits for the slowest (so a step's
wall time names nobody); under parameter servers the chief's samples of each worker's calls, which
also say each worker's share of the updates: a slow worker takes fewer calls and costs its share,
not everyone's step. A worker is compared with the median of the others, so one slow worker in two
stands out as clearly as one in eight.
"""

from __future__ import annotations

import statistics
from collections import deque

from pydantic import Field

from dlinfra.runs.records import NodeState, Record


class Straggler(Record):
    node: str
    ratio: float  # its seconds per step over its peers' median
    seconds: float
    median: float
    since: float  # epoch seconds it has been over the ratio since
    share: float | None = None  # parameter servers: its share of the sampled steps in the window
    fair: float | None = None  # 1 / workers
    replaced: bool | None = None  # straggler.action replace: its machine was (True) or could not be

    def says(self) -> str:
        cost = ""
        if self.share is not None and self.fair is not None:
            cost = f"; it ran {self.share:.0%} of the steps (a fair share: {self.fair:.0%})"
        then = ""
        if self.replaced is not None:
            then = (
                "; its instance is replaced"
                if self.replaced
                else "; not replaced: the nodes share one machine"
            )
        return (
            f"straggler {self.node}: {self.seconds:.3g} s per step, {self.ratio:.1f}x its peers' median "
            f"({self.median:.3g} s){cost}{then}"
        )


class Stragglers(Record):
    """stragglers.json: every worker the watcher named in this run, by node."""

    named: dict[str, Straggler] = Field(default_factory=dict)


def step_seconds(statuses: dict[str, NodeState | None], strategy: str) -> dict[str, tuple[float, float]]:
    """worker → (seconds per step, steps counted so far; 0 where only seconds are known)."""
    if strategy == "multi_worker_mirrored":
        return {
            name: (s.compute_seconds, 0.0)
            for name, s in statuses.items()
            if s is not None and s.role == "worker" and s.compute_seconds
        }
    chief = statuses.get("chief-0")
    return {w: (v[0], v[1]) for w, v in (chief.workers or {}).items() if v[0] > 0} if chief else {}


class StragglerWatch:
    """Fed every watcher poll; names each worker once, when it has been over the ratio for the window."""

    def __init__(self, strategy: str, ratio: float, window: float):
        self.strategy, self.ratio, self.window = strategy, ratio, window
        self.over_since: dict[str, float] = {}
        self.named: dict[str, Straggler] = {}
        # (time, steps by worker) at each look, the last hour's at one look a second
        self._steps: deque[tuple[float, dict[str, float]]] = deque(maxlen=3600)

    def observe(self, now: float, statuses: dict[str, NodeState | None]) -> list[Straggler]:
        figures = step_seconds(statuses, self.strategy)
        self._steps.append((now, {w: steps for w, (_, steps) in figures.items()}))
        if len(figures) < 2:
            return []
        new = []
        for worker, (seconds, _) in figures.items():
            median = statistics.median(s for w, (s, _) in figures.items() if w != worker)
            if median <= 0 or seconds / median < self.ratio:
                self.over_since.pop(worker, None)
                continue
            since = self.over_since.setdefault(worker, now)
            if now - since >= self.window and worker not in self.named:
                share, fair = self._share(worker, since, len(figures))
                found = Straggler(
                    node=worker,
                    ratio=seconds / median,
                    seconds=seconds,
                    median=median,
                    since=since,
                    share=share,
                    fair=fair,
                )
                self.named[worker] = found
                new.append(found)
        return new

    def _share(self, worker: str, since: float, workers: int) -> tuple[float | None, float | None]:
        """Its share of the steps counted since it became slow (parameter servers: the chief's
        tally); of all its life's where no new count came in since (the status comes once a beat)."""
        last = self._steps[-1][1]
        base = next((steps for at, steps in reversed(self._steps) if at <= since), self._steps[0][1])
        done = {w: last.get(w, 0.0) - base.get(w, 0.0) for w in last}
        if sum(done.values()) <= 0:
            done = dict(last)
        total = sum(done.values())
        if total <= 0:
            return None, None
        return done.get(worker, 0.0) / total, 1 / workers
