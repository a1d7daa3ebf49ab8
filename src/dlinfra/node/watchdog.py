"""A node's own limits, kept whether or not anyone watches the run: a forgotten or runaway cluster
must not burn money.

    max_runtime   every node stops after cluster.max_runtime seconds, whatever it is doing
    budget        at cluster.max_cost (NodeConfig.budget: the cluster's price from the catalog) the run
                  checkpoints first: each node drops its trainer's checkpoint flag (node.spot; under
                  the mirrored strategy any one worker's flag makes them all save), each waits for a
                  checkpoint newer than that (or the run's end), the first to stop writes STOPPED
                  with verdict `budget`, and every node stops. A script run (training.command) keeps
                  what its own checkpoints saved: nothing here can ask it for one.

Both clocks start at the node's first life, so restarts do not extend them; the beacon and the
machine's own shutdown are the backstops of a trainer too stuck to keep them (NodeConfig.runs_for).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from dlinfra.contract import BUDGET_CHECKPOINT_SECONDS, EXIT_STOPPED, NodeConfig
from dlinfra.node.spot import CHECKPOINT_FLAG, checkpoint_since
from dlinfra.node.status import NodeStatus
from dlinfra.runs.layout import RunStore


def binding_limit(cfg: NodeConfig) -> str:
    """What stops this node first: `budget` or `max_runtime`."""
    return "budget" if cfg.budget is not None and cfg.budget.seconds < cfg.max_runtime else "max_runtime"


def budget_reason(cfg: NodeConfig) -> str:
    assert cfg.budget is not None
    b = cfg.budget
    return (
        f"budget: cluster.max_cost ${b.max_cost:g} spent (${b.usd_per_hour:.3f}/h for "
        f"{b.seconds / 60:.1f} min from the node's start)"
    )


def start(cfg: NodeConfig, store: RunStore, status: NodeStatus, work: Path) -> None:
    first = status.first_started
    if binding_limit(cfg) == "budget":
        assert cfg.budget is not None
        _at(first + cfg.budget.seconds, lambda: _spend_out(cfg, store, status, work))
    _at(first + cfg.max_runtime, lambda: _stop(cfg, store, status, "max_runtime", None))


def _at(when: float, then: Callable[[], None]) -> None:
    timer = threading.Timer(max(0.0, when - time.time()), then)
    timer.daemon = True
    timer.start()


def _spend_out(cfg: NodeConfig, store: RunStore, status: NodeStatus, work: Path) -> None:
    asked = time.time()
    reason = budget_reason(cfg)
    if cfg.training.command:  # the user's script saves on its own schedule
        _stop(cfg, store, status, reason, "budget")
    print(f"watchdog: {reason}: checkpointing, then stopping", flush=True)
    status.update(state="checkpointing for the budget")
    (work / CHECKPOINT_FLAG).write_text(str(asked), encoding="utf-8")
    # a node that is not the chief may go once the checkpoint is stored: nothing needs it after
    if checkpoint_since(store, asked, asked + BUDGET_CHECKPOINT_SECONDS) == "late":
        print(f"watchdog: no checkpoint in {BUDGET_CHECKPOINT_SECONDS:.0f}s: stopping anyway", flush=True)
    _stop(cfg, store, status, reason, "budget")


def _stop(cfg: NodeConfig, store: RunStore, status: NodeStatus, reason: str, verdict: str | None) -> NoReturn:
    pointer = store.latest_checkpoint()
    if verdict is None:
        print(f"watchdog: max_runtime {cfg.max_runtime:.0f}s reached, stopping", flush=True)
    store.write_marker(
        "STOPPED",
        node=cfg.name,
        reason=reason,
        verdict=verdict,
        last_checkpoint=pointer.prefix if pointer else None,
    )
    status.stop(state="stopped")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STOPPED)
