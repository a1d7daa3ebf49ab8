"""The one deploy flow, for every target:

    preflight → prepare → plan (review, approval) → provision → start → watch → teardown

The flow owns the order and the run's status; the target owns how each step is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dlinfra.errors import DlinfraError
from dlinfra.layout import RunStore
from dlinfra.prepare import Prepared, prepare
from dlinfra.records import Marker, Metrics, NodeState
from dlinfra.run import Run, utc_now
from dlinfra.spec import Spec
from dlinfra.targets import target_for
from dlinfra.targets.base import Cluster, Review, Target, TargetOptions

if TYPE_CHECKING:
    from dlinfra.rerun import Origin

LOG_TAIL_LINES = 30
REPLACE_GRACE = 900.0  # a replacement instance boots and installs TensorFlow before its first beat


@dataclass(frozen=True)
class Request:
    """One deploy as the user asked for it."""

    spec: Spec
    spec_path: Path | None = None
    argv: list[str] = field(default_factory=list)
    keep: bool = False  # leave the target's resources up after the run
    origin: Origin | None = None  # a rerun: the original's code bundle, pins and wheel


@dataclass
class Snapshot:
    nodes: dict[str, NodeState | None]
    marker: Marker | None
    lost: list[str]
    elapsed: float


@dataclass
class Outcome:
    run: Run
    state: str  # DONE | FAILED | STOPPED
    metrics: Metrics | None = None
    failed_node: str | None = None
    error: str | None = None
    log_tail: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    seconds_to_first_step: float | None = None


def plan(request: Request, target: Target) -> tuple[Prepared, Review]:
    """Check, create the run and its user-data, and show what the target would create."""
    spec, origin = request.spec, request.origin
    target.preflight(spec)
    addresses = target.addresses(spec)  # before the run exists: a bad subnet creates nothing
    prepared = prepare(
        spec,
        addresses,
        target.node_install(origin.wheel if origin else None),
        request.spec_path,
        request.argv,
        code=origin.code if origin else None,
        pins=origin.pins if origin else None,
    )
    return prepared, target.plan(prepared)


def deploy(
    request: Request,
    options: TargetOptions,
    approve: Callable[[str], bool],
    on_update: Callable[[Snapshot], None] = lambda s: None,
    started: float | None = None,
) -> Outcome:
    """Run the experiment on its target and always leave it torn down (unless `request.keep`)."""
    target = target_for(request.spec.target, options)
    prepared, review = plan(request, target)
    run = prepared.run
    if not review.needs_approval:
        options.log(review.text)
    elif not approve(review.text):
        run.update_manifest(status="CANCELLED")
        raise DlinfraError(f"apply cancelled; nothing was created. The plan stays in {run.dir}")
    try:
        target.provision(prepared, review)
        cluster = target.start(prepared)
        return watch(prepared, cluster, on_update, started=started)
    finally:
        if target.leaves_resources and not request.keep:
            options.log(target.teardown(run))


def watch(
    prepared: Prepared,
    cluster: Cluster,
    on_update: Callable[[Snapshot], None] = lambda s: None,
    poll: float = 1.0,
    started: float | None = None,
) -> Outcome:
    """Follow the run through the store until it ends; always stops the cluster."""
    store, run = prepared.store, prepared.run
    timeout = prepared.spec.cluster.heartbeat_timeout
    names = list(prepared.user_data)
    started = started or time.time()
    run.update_manifest(status="RUNNING", started=utc_now())
    try:
        while True:
            snap = _snapshot(store, names, timeout, started)
            on_update(snap)
            if snap.marker is not None:
                _let_nodes_finish(cluster, seconds=3 * poll + 5)
                on_update(_snapshot(store, names, timeout, started))
                break
            codes = cluster.poll()
            crashed = {n: c for n, c in codes.items() if c not in (None, 0)}
            if crashed:
                name, code = sorted(crashed.items())[0]
                store.write_marker("FAILED", node=name, error=f"node process exited with code {code}")
            elif snap.lost:
                # A node blocked on a frozen peer inside TensorFlow goes quiet too: name every silent one.
                silent = ", ".join(snap.lost)
                store.write_marker(
                    "FAILED",
                    node=snap.lost[0],
                    error=f"no heartbeat for {timeout:.0f}s from {silent} (hung or unreachable)",
                )
            elif codes and all(c == 0 for c in codes.values()):
                time.sleep(poll)  # the chief's marker may land right after its exit
                if store.marker() is None:
                    store.write_marker("FAILED", error="every node exited without a result")
            else:
                time.sleep(poll)
    except KeyboardInterrupt:
        store.write_marker("STOPPED", reason="interrupted (Ctrl-C)")
        raise
    finally:
        cluster.stop()
        marker = store.marker()
        run.update_manifest(status=marker.marker if marker else "STOPPED", finished=utc_now())
        run.publish_manifest()
    return _outcome(prepared, store, started)


def _let_nodes_finish(cluster: Cluster, seconds: float) -> None:
    """Servers notice the marker on their next poll and record their final state themselves."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(c is None for c in cluster.exit_codes().values()):
        time.sleep(0.2)


def _snapshot(store: RunStore, names: list[str], heartbeat_timeout: float, started: float) -> Snapshot:
    now = time.time()
    nodes = store.statuses(names)

    def silent_for(st: NodeState) -> float:
        grace = REPLACE_GRACE if st.state == "replacing" else 0.0
        return now - st.heartbeat - grace

    lost = [
        name for name, st in nodes.items() if st and not st.finished and silent_for(st) > heartbeat_timeout
    ]
    lost.sort(key=lambda name: nodes[name].heartbeat)  # type: ignore[union-attr]  # longest silent first
    return Snapshot(nodes, store.marker(), lost, now - started)


def _outcome(prepared: Prepared, store: RunStore, started: float) -> Outcome:
    run = prepared.run
    marker = store.marker()
    state = marker.marker if marker else "STOPPED"
    metrics = store.metrics() if state == "DONE" else None
    error = (marker.error or marker.reason) if marker else None
    if marker and marker.last_checkpoint:  # what a STOPPED run can be resumed or inspected from
        error = f"{error}; last checkpoint {store.checkpoint_uri(marker.last_checkpoint)}"
    outcome = Outcome(run, state, metrics, marker.node if marker else None, error)
    outcome.wall_seconds = time.time() - started
    if metrics and metrics.first_step_at:
        outcome.seconds_to_first_step = metrics.first_step_at - started
    if state == "FAILED" and outcome.failed_node:
        outcome.log_tail = run.node_log(outcome.failed_node)[-LOG_TAIL_LINES:]
    if metrics:
        run.update_manifest(metrics=metrics.summary())
    return outcome
