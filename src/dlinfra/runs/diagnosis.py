"""What went wrong with a running cluster, from what the nodes' beacons publish.

Verdicts, in the order they are checked (the first that holds names the culprit):
    crashed  a node's process ended with an error (its supervisor reports the exit code)
    frozen   a trainer stopped (SIGSTOP, a debugger) for longer than heartbeat_timeout
    lost     a node's beacon went silent for heartbeat_timeout: the machine or its supervisor is gone
    stalled  every node alive, yet no training step for stall_timeout (the first counted from the start),
             or sooner for scripts whose reports set a pace (stall_limit) and that idle meanwhile
A pure function of the node states and the clock, so it is tested table by table.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from dlinfra.contract import EXIT_INTERRUPTED
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import NodeState
from dlinfra.runs.restarts import first_to_fail

REPLACE_GRACE = 900.0  # a replacement instance boots and installs TensorFlow before its first beat
STACKS_WAIT = 30.0
# Frames that only say "waiting": the interesting frame is the first one below them.
_PLUMBING = ("threading.py", "queue.py", "selectors.py", "concurrent/futures", "socket.py")
# Where a node waits for its peers: TensorFlow's collectives and RPCs (Keras calls into them).
_WAITING_FOR_PEERS = re.compile(r"[(/](tensorflow|keras|tf_keras)/")


@dataclass(frozen=True)
class Verdict:
    kind: str  # crashed | frozen | lost | stalled
    nodes: list[str]  # culprits, the most likely first
    detail: str

    @property
    def wants_stacks(self) -> bool:
        """Processes that are there but not moving: their stacks say where they wait."""
        return self.kind in ("frozen", "stalled")


def diagnose(
    nodes: dict[str, NodeState | None],
    exit_codes: dict[str, int | None],
    heartbeat_timeout: float,
    stall_timeout: float,
    now: float | None = None,
    store_back: float = 0.0,
) -> Verdict | None:
    """`store_back`: when the watcher's store last answered after an outage. Nodes could not write
    through it either, so silence and idleness count from then at the earliest (found by
    bench_chaos: a 14 s outage failed a run as lost under a 20 s heartbeat_timeout)."""
    now = time.time() if now is None else now
    # a node that left for a spot notice is being replaced, not crashed
    crashed = {n: c for n, c in exit_codes.items() if c not in (None, 0, EXIT_INTERRUPTED)}
    if crashed:
        # the first to fail, not the first by name: a peer that crashed recovering from it comes after
        name, *others = first_to_fail(sorted(crashed), nodes, now)
        if name in crashed:
            return Verdict("crashed", [name, *others], f"node process exited with code {crashed[name]}")
        first = others[0]
        return Verdict(
            "crashed", [name, *others], f"{first} exited with code {crashed[first]} after {name} restarted"
        )
    live = {n: s for n, s in nodes.items() if s is not None and not s.finished}
    frozen = sorted(
        (
            n
            for n, s in live.items()
            if s.stopped_since is not None and now - s.stopped_since > heartbeat_timeout
        ),
        key=lambda n: live[n].stopped_since or now,
    )
    if frozen:
        seconds = now - (live[frozen[0]].stopped_since or now)
        return Verdict("frozen", frozen, f"{', '.join(frozen)} stopped for {seconds:.0f}s (process state T)")

    def silent_for(s: NodeState) -> float:
        replaced = s.state.startswith("replacing") or s.interrupted
        return now - max(s.heartbeat, store_back) - (REPLACE_GRACE if replaced else 0.0)

    lost = sorted(
        (n for n, s in live.items() if silent_for(s) > heartbeat_timeout), key=lambda n: live[n].heartbeat
    )
    if lost:
        return Verdict(
            "lost",
            lost,
            f"no heartbeat for {heartbeat_timeout:.0f}s from {', '.join(lost)} "
            "(the machine or its supervisor is gone)",
        )
    progress = [s.progress_at for s in live.values() if s.progress_at is not None]
    busy = any(
        s.state == "exporting" or s.state.startswith(("restarting", "replacing")) or s.interrupted
        for s in live.values()
    )
    limit, why = stall_limit(live.values(), stall_timeout)
    # the pace's bound holds only while every script idles too: one at work on CPU between reports
    # (an evaluation, a large save) is paused, not hung, until stall_timeout
    working = [s.working_at for s in live.values() if s.working_at is not None]
    idle_since = max([*progress, *working, store_back]) if progress else 0.0
    stepped = max([*progress, store_back]) if progress else 0.0
    if progress and not busy and (now - stepped > stall_timeout or now - idle_since > limit):
        waiting = sorted(live)
        return Verdict(
            "stalled",
            waiting,
            f"no training step for {now - max(progress):.0f}s ({why}) while every node is alive",
        )
    return None


def stall_limit(live: Iterable[NodeState], stall_timeout: float) -> tuple[float, str]:
    """Seconds without a step before the run is stalled, and why: the pace of the scripts' own
    reports (the most patient node's bound: node.script_progress), stall_timeout at most."""
    paced = [s.stall_after for s in live if s.stall_after is not None]
    if paced and max(paced) < stall_timeout:
        return max(paced), f"its reports' pace allows {max(paced):.0f}s"
    return stall_timeout, f"cluster.stall_timeout {stall_timeout:.0f}s"


def collect_stacks(store: RunStore, nodes: list[str], wait: float = STACKS_WAIT) -> dict[str, str]:
    """Ask the beacons for their trainers' stacks and wait for the answers: node → dump text."""
    request = store.request_stacks()
    deadline = time.monotonic() + wait
    dumps: dict[str, str] = {}
    while len(dumps) < len(nodes) and time.monotonic() < deadline:
        for node in nodes:
            found = store.stacks(node)
            if node not in dumps and found is not None and found[0] == request:
                dumps[node] = found[1]
        time.sleep(0.5)
    return dumps


def hung_first(names: list[str], dumps: dict[str, str]) -> list[str]:
    """A stalled run's nodes, those that hang on their own first: a node waiting in TensorFlow (a
    collective, an RPC) waits for a peer; the peer stuck outside it (in time.sleep, in user code) is
    the one that hung."""
    return sorted(names, key=lambda name: name not in dumps or _in_tensorflow(_innermost(dumps[name])))


def _in_tensorflow(frame: str | None) -> bool:
    return frame is None or _WAITING_FOR_PEERS.search(frame) is not None


def where_it_waits(dump: str) -> str:
    """The main thread's innermost frame that is not mere waiting plumbing, from a py-spy dump."""
    frame = _innermost(dump)
    return "no Python main thread in the dump" if frame is None else f"waits in {frame}"


def _innermost(dump: str) -> str | None:
    lines = dump.splitlines()
    pid = lines[0].split(":")[0].removeprefix("Process ").strip() if lines else ""
    # The main thread is named when py-spy can read names; its thread id is always the process id.
    start = next((i for i, line in enumerate(lines) if '"MainThread"' in line), None)
    if start is None:
        start = next((i for i, line in enumerate(lines) if line.startswith(f"Thread {pid} ")), None)
    if start is None:
        return None
    frames = []
    for line in lines[start + 1 :]:
        if not line.startswith("    "):
            break
        frames.append(line.strip())
    useful = [f for f in frames if not any(p in f for p in _PLUMBING)]
    return (useful or frames or ["?"])[0]


def stack_summary(
    verdict: Verdict, nodes: dict[str, NodeState | None], dumps: dict[str, str]
) -> dict[str, str]:
    """node → one line: stopped, where it waits, or that no dump came back."""
    out = {}
    for name in sorted(set(dumps) | set(verdict.nodes)):
        state = nodes.get(name)
        if state is not None and state.process == "stopped":
            out[name] = "is stopped" + (f", {where_it_waits(dumps[name])}" if name in dumps else "")
        elif name in dumps:
            out[name] = where_it_waits(dumps[name])
        else:
            out[name] = "sent no stack dump"
    return out
