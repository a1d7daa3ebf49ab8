"""A mirrored node whose training ended well stays a member of its cluster until the run ends.

Under multi_worker_mirrored no member trains without every other. A member that dies after another
finished (the owner while it saves the model, a worker in its last collective) begins a new life that
waits for all of them, and its supervisor restarts only what failed (systemd on EC2). A member that
had left made that new life hang until its stall timeout (bench_restarts seed 59: the owner killed
after worker-1 exited 0). So the member stays: it leaves when the run's marker is written, and
rejoins, exiting for a restart, when a peer begins a new life first. The local launcher restarts a
staying member with its cluster by itself (targets.local, restart_together): the same outcome.
"""

from __future__ import annotations

import time

from dlinfra.contract import EXIT_DONE, EXIT_RETRY, NodeConfig
from dlinfra.node.status import NodeStatus
from dlinfra.node.supervision import note_restart_cause
from dlinfra.runs import restarts
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import Marker, NodeState

# How often a staying member looks at the store, and how many of its peers' states it reads a look:
# the owner's each time (its death after the others finished is the case this is for), the others in
# turn. Every member stays while the owner saves: reading every peer each look would cost a cluster of
# N members N² reads every 2 s (100 workers: 5,000 GETs a second, S3's limit for one prefix).
# A local store's faster pace (Store.poll_seconds) applies where it is faster: its reads are free.
LOOK_SECONDS = 2.0
PEERS_PER_LOOK = 8


def stay_until_the_run_ends(cfg: NodeConfig, store: RunStore, status: NodeStatus, *, step: int | None) -> int:
    """This life's end after its training ended well: at once for a node whose cluster goes on
    without it (the owner, a parameter-server cluster's nodes), else once the run ends, or, with
    EXIT_RETRY, as soon as a peer begins a new life (the new life's cause says whose)."""
    status.stop(state="done", step=step)
    if cfg.strategy != "multi_worker_mirrored" or cfg.is_chief:
        return EXIT_DONE
    owner = "worker-0"  # NodeConfig.is_chief under multi_worker_mirrored
    names = [f"{role}-{i}" for role, addresses in cfg.peers.items() for i in range(len(addresses))]
    others = [name for name in names if name not in (owner, cfg.name)]
    since, looks = time.time(), 0
    print("training ended here: staying with the cluster until the run ends", flush=True)
    while True:
        looked = [owner, *_in_turn(others, looks, PEERS_PER_LOOK - 1)]
        looks += 1
        try:
            if store.marker() is not None:
                return EXIT_DONE
            states = store.statuses(looked)
        except Exception as exc:  # a store outage: the run has not ended for it, look again
            print(f"could not read the run's state: {exc}", flush=True)
            time.sleep(min(LOOK_SECONDS, store.store.poll_seconds))
            continue
        began = [name for name, st in states.items() if _begins_again(st, since)]
        if began:
            print(f"{began[0]} began a new life: rejoining the cluster", flush=True)
            note_restart_cause(status.path.parent, f"restarted with the cluster after {began[0]}")
            return EXIT_RETRY
        time.sleep(min(LOOK_SECONDS, store.store.poll_seconds))


def _begins_again(st: NodeState | None, since: float) -> bool:
    """A peer between two lives, or in a life begun since this node began to stay."""
    return st is not None and (restarts.ended_for_a_restart(st) or st.started > since)


def _in_turn(names: list[str], look: int, per_look: int) -> list[str]:
    """The `per_look` names this look reads, so that consecutive looks cover all of them in turn."""
    count = min(per_look, len(names))
    return [names[(look * count + k) % len(names)] for k in range(count)]


def until_the_run_ends(store: RunStore) -> Marker:
    """The run's end, for a node that only serves until then, looked for at the store's pace
    (Store.poll_seconds). Against S3 from a 1-vCPU instance (a VM under emulation more so), a look a
    second took a sixth of the core its TensorFlow server needs; a local run's directory is read in
    microseconds, and its command waits for its servers to leave."""
    while (marker := store.marker()) is None:
        time.sleep(store.store.poll_seconds)
    return marker
