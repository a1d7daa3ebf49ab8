"""A node's restarts, as the run's record keeps them and as a user reads them: why its last life
ended, where the new one resumed, what it cost; and which node a failure is blamed on.

A new life writes its own record (node.status) from the store's word on the last one; it completes
it when it trains again. Everything here is a pure function of those records and the node states.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from dlinfra.runs.records import NodeState, Restart

SCRIPT_CHECKPOINTS_PLACE = "$DLINFRA_CHECKPOINT_DIR"
PROGRAM_CHECKPOINTS_PLACE = "the store's checkpoints"
# How far back a restart not yet trained past still belongs to the incident of a failure now (a node
# that never reports its progress, a ps serving again, leaves its last restart open for good)
INCIDENT_SECONDS = 300.0


def cause_of(previous: NodeState) -> str:
    """Why a node's earlier life ended, from the last state it (or its beacon) published."""
    if previous.state == "lost peer":
        return "lost peer"
    if previous.state == "replacing (straggler)":
        return "replaced (straggler)"
    if previous.interrupted:
        return "spot notice"
    if previous.error and previous.error.startswith(("killed by signal", "exited with code")):
        return previous.error
    if previous.process == "gone":
        return "process died"
    return "lost"  # its beacon went silent without a last word: the machine, or the beacon itself


def began(previous: NodeState, life: int, now: float, told: tuple[str, float] | None = None) -> Restart:
    """The record of a new life begun after `previous` (not yet resumed); `told`: its supervisor's
    word on why and when it ended the last life, where the node had no chance to say."""
    cause, failed_at = told or (cause_of(previous), previous.heartbeat)
    return Restart(node=previous.node, life=life, cause=cause, failed_at=failed_at, restarted_at=now)


def ended_for_a_restart(st: NodeState) -> bool:
    """A life that ended to be started again, whose next life has not said a word yet."""
    killed = st.process == "gone" and (st.error or "").startswith("killed by signal")  # beacon.watch
    return st.state in ("script killed", "lost peer") or (killed and not st.finished and not st.interrupted)


def of_nodes(nodes: Iterable[NodeState | None]) -> list[Restart]:
    """Every node's restarts, by the time of their fault: a node between two lives counts too (the
    run may end, or a peer fail, before its next life publishes)."""
    states = [st for st in nodes if st is not None]
    found = [r for st in states for r in st.restart_history]
    between = [st for st in states if ended_for_a_restart(st)]
    found += [began(st, len(st.restart_history) + 2, st.heartbeat) for st in between]
    return sorted(found, key=lambda r: (r.failed_at, r.node))


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def scratch_line(r: Restart) -> str:
    return f"{r.node} restarted from scratch: nothing in {r.from_scratch}"


def summary(found: list[Restart]) -> str:
    """The result's restarts row: how many, and of which nodes."""
    if not found:
        return "none"
    nodes = sorted({r.node for r in found})
    return f"{len(found)} ({', '.join(nodes)})"


class News:
    """Each restart said once, as it happens: when its node trains again (the line says from where
    and what it cost); one that found no checkpoint at once, too."""

    def __init__(self) -> None:
        self.said: set[tuple[str, int, str]] = set()

    def __call__(self, nodes: Iterable[NodeState | None]) -> list[str]:
        lines = []
        for r in of_nodes(nodes):
            for what, due, text in (
                ("scratch", bool(r.from_scratch), scratch_line),
                ("resumed", r.resumed_at is not None, line),
            ):
                if due and (r.node, r.life, what) not in self.said:
                    self.said.add((r.node, r.life, what))
                    lines.append(text(r))
        return lines


def line(r: Restart) -> str:
    """One restart, as the deploy output, the result and `show` say it."""
    head = f"{r.node} restarted ({r.cause}) at {clock(r.failed_at)}"
    if r.from_scratch:
        where = f"from scratch: nothing in {r.from_scratch}"
    elif r.checkpoint_step is not None:
        where = f"resumed from step {r.checkpoint_step}"
    elif r.restored_files is not None:
        first = f", first report at step {r.first_step}" if r.first_step is not None else ""
        where = f"resumed from its {r.restored_files} checkpoint files{first}"
    elif r.first_step is not None:
        where = f"resumed at step {r.first_step}"
    elif r.resumed_at is not None:
        where = "training again"
    else:
        where = "not training again before the run ended"  # said only once it has (News, the result)
    lost = f"; {r.seconds_lost:.1f} s lost" if r.seconds_lost is not None else ""
    return f"{head}; {where}{lost}"


def _recovering(nodes: dict[str, NodeState | None], now: float) -> list[Restart]:
    return [
        r for r in of_nodes(nodes.values()) if r.resumed_at is None and now - r.failed_at < INCIDENT_SECONDS
    ]


def first_to_fail(
    candidates: list[str], nodes: dict[str, NodeState | None], now: float | None = None
) -> list[str]:
    """`candidates` with the node whose process failed first in front. One incident's faults are the
    restarts not yet trained past (a cluster still recovering): the earliest of them started it, and
    a node that then failed on its way back (a restarted worker's pull, a peer's timeout) is its
    consequence. Without such a restart, the earliest failure as the nodes published it."""
    recovering = _recovering(nodes, time.time() if now is None else now)
    if recovering:
        first = recovering[0].node
        return [first, *(n for n in candidates if n != first)]

    def failed_at(name: str) -> tuple[float, str]:
        st = nodes.get(name)
        return (st.heartbeat if st is not None else float("inf"), name)

    return sorted(candidates, key=failed_at)


def blamed(node: str, nodes: dict[str, NodeState | None], now: float | None = None) -> tuple[str, str]:
    """(the node to blame for `node`'s failure, what to add to its message): `node` itself, unless it
    failed while the cluster recovered from another node's earlier fault."""
    recovering = _recovering(nodes, time.time() if now is None else now)
    if not recovering or recovering[0].node == node:
        return node, ""
    first = recovering[0]
    return first.node, f" (after {first.node} restarted: {first.cause} at {clock(first.failed_at)})"
