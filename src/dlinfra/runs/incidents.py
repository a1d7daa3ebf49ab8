"""The faults a run lived through without a node losing its life (records.Incident), as its result
shows them beside its restarts: a trainer paused and thawed, the store out of reach for a while."""

from __future__ import annotations

from collections.abc import Iterable

from dlinfra.runs.records import Incident, NodeState
from dlinfra.runs.restarts import clock


def of_nodes(nodes: Iterable[NodeState | None]) -> list[Incident]:
    """Every node's, by when they began. One store outage is seen by every node that wrote through it:
    each node's own sighting is kept (what it cost that node)."""
    found = [i for st in nodes if st is not None for i in st.incidents]
    return sorted(found, key=lambda i: (i.at, i.node))


def summary(found: list[Incident]) -> str:
    """The result's row: how many of each kind, and on which nodes."""
    kinds = sorted({i.kind for i in found})
    parts = []
    for kind in kinds:
        mine = [i for i in found if i.kind == kind]
        parts.append(f"{kind} {len(mine)} ({', '.join(sorted({i.node for i in mine}))})")
    return "; ".join(parts) or "none"


def line(i: Incident) -> str:
    what = "its trainer stopped" if i.kind == "paused" else "the store unreachable"
    return f"{i.kind}: {i.node}, {what} for {i.seconds:.1f} s from {clock(i.at)}; it went on in the same life"
