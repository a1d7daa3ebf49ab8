"""Following a started run through its store: the owner's watch loop (verdicts, healing through the
cluster, the stop) and a follower's view of a run someone else owns."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from dlinfra.errors import DlinfraError
from dlinfra.node.masked_log import masker
from dlinfra.prepare import Prepared
from dlinfra.runs import incidents, preflight_history, restarts, versions
from dlinfra.runs.diagnosis import Verdict, collect_stacks, diagnose, hung_first, stack_summary
from dlinfra.runs.layout import RunStore
from dlinfra.runs.ownership import Lease, owner_of
from dlinfra.runs.records import Incident, Marker, Metrics, NodeState, Restart
from dlinfra.runs.run import Run, home, utc_now
from dlinfra.runs.startup import breakdown
from dlinfra.runs.stragglers import Straggler, Stragglers, StragglerWatch
from dlinfra.sizing.record import record_run
from dlinfra.targets.base import Cluster, Replaces

LOG_TAIL_LINES = 30
OWNER_CHECK_SECONDS = 10.0  # how often a follower looks whether the run's owner is still there


@dataclass
class Snapshot:
    nodes: dict[str, NodeState | None]
    marker: Marker | None
    elapsed: float
    stragglers: dict[str, Straggler] = field(default_factory=dict)  # named so far (runs.stragglers)


@dataclass
class Outcome:
    run: Run
    # DONE | FAILED | STOPPED, or DETACHED (deploy --detach returned with the nodes up), HANDED_OVER
    # (the same, the run given to the account's controller)
    state: str
    metrics: Metrics | None = None
    failed_node: str | None = None
    error: str | None = None
    log_tail: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    seconds_to_first_step: float | None = None
    startup: list[tuple[str, float]] = field(default_factory=list)  # see dlinfra.runs.startup
    stragglers: list[Straggler] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)  # every node's, by the time of the fault
    incidents: list[Incident] = field(default_factory=list)  # faults lived through in the same life


def watch(
    prepared: Prepared,
    cluster: Cluster,
    on_update: Callable[[Snapshot], None] = lambda s: None,
    poll: float = 1.0,
    started: float | None = None,
    stop_on_interrupt: bool = True,
    lease: Lease | None = None,
) -> Outcome:
    """Follow the run through the store until it ends; then stop the cluster. Ctrl-C stops the
    run too, unless `stop_on_interrupt` is False: then it only stops watching (state DETACHED).
    Once another owner took the `lease` over, it acts no more: it only follows (follow_only)."""
    store, run = prepared.store, prepared.run
    names = list(prepared.user_data)
    started = started or time.time()
    if run.manifest().started is None:  # re-attached runs keep their start
        run.update_manifest(status="RUNNING", started=utc_now(), command_started=started)
    ended_unwatched = store.marker()  # a detached run may have ended before anyone looked
    left_running = False
    slow = prepared.spec.cluster.straggler
    stragglers = StragglerWatch(prepared.spec.strategy, slow.ratio, slow.window)
    try:
        while True:
            if lease is not None and not lease.held:
                left_running = True
                return follow_only(prepared, on_update, started) or Outcome(run, "DETACHED")
            # poll first: it may block (a heal's apply takes a minute), and a snapshot taken before it
            # would make every node look silent for that long (seen: a healed run failed as "lost")
            codes = cluster.poll()
            snap = _snapshot(store, names, started)
            if new := stragglers.observe(time.time(), snap.nodes):
                if slow.action == "replace":
                    _replace(cluster, new)
                store.put_stragglers(Stragglers(named=stragglers.named))
            snap.stragglers = stragglers.named
            on_update(snap)
            if snap.marker is not None:
                _let_nodes_finish(cluster, seconds=3 * poll + 5)
                on_update(_snapshot(store, names, started))
                break
            limits = prepared.spec.cluster
            timeouts = limits.heartbeat_timeout, limits.stall_timeout
            if verdict := diagnose(snap.nodes, codes, *timeouts, store_back=store.store.reachable_since):
                _fail(store, verdict, snap.nodes)
            elif codes and all(c == 0 for c in codes.values()):
                time.sleep(poll)  # the chief's marker may land right after its exit
                if store.marker() is None:
                    store.write_marker("FAILED", error="every node exited without a result")
            else:
                time.sleep(_pace(snap, poll, store))
    except KeyboardInterrupt:
        if not stop_on_interrupt:  # `dlinfra watch`: Ctrl-C stops watching, not the run
            left_running = True
            return Outcome(run, "DETACHED")
        store.write_marker("STOPPED", reason="interrupted (Ctrl-C)")
        raise
    finally:
        if not left_running:
            _stop(cluster, run, store, names, ended_unwatched)
            try:
                preflight_history.record(prepared.spec, store, run.id)
                record_run(prepared.spec, store, run.id, home())
            except DlinfraError as exc:  # the run's own result is safe; only the histories wait
                print(f"warning: the preflight or sizing history was not updated: {exc}")
    return _outcome(prepared, store, started, ended_unwatched.time if ended_unwatched else time.time())


def follow_only(
    prepared: Prepared, on_update: Callable[[Snapshot], None], started: float, until_unowned: bool = False
) -> Outcome | None:
    """Progress and the result of a run someone else owns: no heal, no verdict, no teardown. With
    `until_unowned`, None once nobody owns the unfinished run any more (its lease lapsed or was
    given up): the caller may take it."""
    store, names = prepared.store, list(prepared.user_data)
    checked = time.monotonic()
    try:
        while (snap := _snapshot(store, names, started)).marker is None:
            on_update(snap)
            if until_unowned and time.monotonic() - checked > OWNER_CHECK_SECONDS:
                checked = time.monotonic()
                if owner_of(store) is None:
                    return None
            time.sleep(2.0)
    except KeyboardInterrupt:  # Ctrl-C stops following; the run and its owner go on
        return Outcome(prepared.run, "DETACHED")
    on_update(snap)
    return _outcome(prepared, store, started, snap.marker.time)


def _stop(
    cluster: Cluster, run: Run, store: RunStore, names: list[str], ended_unwatched: Marker | None
) -> None:
    cluster.stop()
    marker = store.marker()
    finished = utc_now(ended_unwatched.time) if ended_unwatched else utc_now()
    # What each node proved it trained on, kept with the run (statuses are overwritten by reruns).
    statuses = store.statuses(names)
    devices = {name: st.devices for name, st in statuses.items() if st and st.devices}
    ran, each = versions.reported(
        run.manifest(), {name: st.versions if st else None for name, st in statuses.items()}
    )
    run.update_manifest(
        status=marker.marker if marker else "STOPPED",
        finished=finished,
        devices=devices,
        versions=ran,
        node_versions=each,
        version_changes=versions.rerun_changes(run, ran),
    )
    run.publish_manifest()


def _replace(cluster: Cluster, stragglers: list[Straggler]) -> None:
    """cluster.straggler.action replace: each newly named straggler's machine, where nodes have
    machines of their own (on one machine a replacement would run on the same one: named only)."""
    for straggler in stragglers:
        straggler.replaced = isinstance(cluster, Replaces)
        if isinstance(cluster, Replaces):
            cluster.replace_straggler(straggler.node)


def _pace(snap: Snapshot, poll: float, store: RunStore) -> float:
    """Once the chief exports, the run's end is about a second away and the user waits for it: look
    at the store's own pace then, where that is faster (a local directory's; Store.poll_seconds)."""
    exporting = any(st is not None and st.state == "exporting" for st in snap.nodes.values())
    return min(poll, store.store.poll_seconds) if exporting else poll


def _let_nodes_finish(cluster: Cluster, seconds: float) -> None:
    """Servers notice the marker on their next poll and record their final state themselves."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(c is None for c in cluster.exit_codes().values()):
        time.sleep(0.2)


def _snapshot(store: RunStore, names: list[str], started: float) -> Snapshot:
    return Snapshot(store.statuses(names), store.marker(), time.time() - started)


def _fail(store: RunStore, verdict: Verdict, nodes: dict[str, NodeState | None]) -> None:
    """FAILED, naming the culprit and the verdict; for nodes that are there but not moving, first
    their stacks (kept in the store) and where each one waits."""
    error = f"{verdict.kind}: {verdict.detail}"
    stacks, culprit = None, verdict.nodes[0]
    if verdict.wants_stacks:
        alive = [n for n, s in nodes.items() if s is not None and not s.finished]
        dumps = collect_stacks(store, alive)
        stacks = stack_summary(verdict, nodes, dumps)
        order = list(stacks)
        if verdict.kind == "stalled":  # every node is named: the one that hung, not its waiting peers
            order = hung_first(order, dumps)
            culprit = hung_first(verdict.nodes, dumps)[0]
        error += "; " + "; ".join(f"{name} {stacks[name]}" for name in order)
    store.write_marker(
        "FAILED",
        node=culprit,
        verdict=verdict.kind,
        error=error,
        stacks=stacks,
        restarts=restarts.of_nodes(nodes.values()),
    )


def _outcome(prepared: Prepared, store: RunStore, started: float, ended: float) -> Outcome:
    run = prepared.run
    outcome = ended_outcome(run, store, started, ended)
    if outcome.metrics:
        run.update_manifest(metrics=outcome.metrics.summary())
    run.update_manifest(restarts=len(outcome.restarts))
    return outcome


def recorded_outcome(run: Run) -> Outcome:
    """A recorded run's result, as its watcher showed it when it ended (`dlinfra report`): on the
    clock of its manifest (the command's start, the run's end) and its store's records."""
    manifest, store = run.manifest(), run.store()
    started = manifest.command_started or _epoch(manifest.started) or _epoch(manifest.created) or 0.0
    marker = store.marker()
    ended = _epoch(manifest.finished) or (marker.time if marker else None) or started
    if manifest.status not in ("DONE", "FAILED", "STOPPED") and marker is None:
        return Outcome(run, manifest.status, wall_seconds=max(0.0, time.time() - started))
    return ended_outcome(run, store, started, ended)


def _epoch(stamp: str | None) -> float | None:
    return datetime.fromisoformat(stamp).timestamp() if stamp else None


def ended_outcome(run: Run, store: RunStore, started: float, ended: float) -> Outcome:
    """How a run ended, read from its store (nothing is written): its verdict, metrics, startup,
    stragglers, restarts, and a failed node's log tail."""
    marker = store.marker()
    state = marker.marker if marker else "STOPPED"
    metrics = store.metrics() if state == "DONE" else None
    error = (marker.error or marker.reason) if marker else None
    if marker and marker.last_checkpoint:  # what a STOPPED run can be resumed or inspected from
        error = f"{error}; last checkpoint {store.checkpoint_uri(marker.last_checkpoint)}"
    if error and "Network is unreachable" in error and run.manifest().network == "private":
        error += (
            ". Fix: this local run's nodes have no network beyond their cluster; if the training "
            "code must fetch something, set cluster.local_network: host"
        )
    outcome = Outcome(run, state, metrics, marker.node if marker else None, error)
    outcome.wall_seconds = ended - started
    statuses = store.statuses(run.manifest().nodes)
    if metrics and metrics.first_step_at:
        outcome.seconds_to_first_step = metrics.first_step_at - started
        outcome.startup = breakdown(statuses, metrics.strategy, started)
    outcome.stragglers = list(store.stragglers().named.values())
    # the nodes' own word, as they left it: newer than the marker's or the metrics' copy (a restart
    # that trained again after the chief wrote them)
    outcome.restarts = restarts.of_nodes(statuses.values())
    outcome.incidents = incidents.of_nodes(statuses.values())
    if state == "FAILED" and outcome.failed_node:
        # the run dir's log is the node's own, unmasked: this shell's secrets are masked in what it prints
        mask = masker()
        outcome.log_tail = [mask(line) for line in run.node_log(outcome.failed_node)[-LOG_TAIL_LINES:]]
    return outcome
