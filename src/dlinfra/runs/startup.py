"""Where a run's seconds before its first step went: each node's trainer marks its startup phases
(contract.PHASES) in its status; this puts them on one clock, the command's.

The first step waits for the training node (the chief, or worker 0 under multi_worker_mirrored) to
pass every phase, and its `peers` phase for the slowest other node to have loaded TensorFlow and
started serving: both are shown, so a slow peer is told from a slow chief.
"""

from __future__ import annotations

from dlinfra.contract import PHASES
from dlinfra.runs.records import NodeState


def training_node(strategy: str) -> str:
    return "worker-0" if strategy == "multi_worker_mirrored" else "chief-0"


def breakdown(
    statuses: dict[str, NodeState | None], strategy: str, started: float
) -> list[tuple[str, float]]:
    """(phase, seconds after `started`) on the training node's way to its first step, with the last
    other node's TensorFlow load slotted in where it happened. Empty when nothing was marked."""
    chief = statuses.get(training_node(strategy))
    if chief is None or not chief.phases:
        return []
    steps = [(phase, chief.phases[phase] - started) for phase in PHASES if phase in chief.phases]
    others = {
        name: s.phases["tensorflow"]
        for name, s in statuses.items()
        if s is not None and name != chief.node and "tensorflow" in s.phases
    }
    if others:
        last = max(others, key=others.__getitem__)
        steps.append((f"{last}: tensorflow (the last peer)", others[last] - started))
    return sorted(steps, key=lambda step: step[1])


def describe(steps: list[tuple[str, float]]) -> str:
    """`spawned 1.2 · up 1.6 · tensorflow 6.8 · …` (seconds after the command started)."""
    return " · ".join(f"{phase} {seconds:.1f}" for phase, seconds in steps)
