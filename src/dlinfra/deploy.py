"""The one deploy flow, for every target:

    preflight → prepare → plan (review, approval) → provision → start → watch → teardown

The flow owns the order and the run's status; the target owns how each step is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from dlinfra.contract import NodeConfig, StoreConfig
from dlinfra.errors import DlinfraError, RunFailed
from dlinfra.pinned_data import absolute_dataset
from dlinfra.prepare import Environment, Prepared, boot_install, checked_rate, prepare
from dlinfra.render import build_node_configs, render_cluster
from dlinfra.runs.compare import lock_changes
from dlinfra.runs.diagnosis import Verdict, collect_stacks, diagnose, stack_summary
from dlinfra.runs.layout import RunStore
from dlinfra.runs.ownership import Lease, claim, cli_holder, owner_of
from dlinfra.runs.records import Marker, Metrics, NodeState, Owner
from dlinfra.runs.run import Run, utc_now
from dlinfra.runs.startup import breakdown
from dlinfra.spec.model import Spec
from dlinfra.targets import target_for
from dlinfra.targets.base import Cluster, Review, Target, TargetOptions

if TYPE_CHECKING:
    from dlinfra.runs.rerun import Origin

LOG_TAIL_LINES = 30
OWNER_CHECK_SECONDS = 10.0  # how often a follower looks whether the run's owner is still there


@dataclass(frozen=True)
class Request:
    """One deploy as the user asked for it."""

    spec: Spec
    spec_path: Path | None = None
    argv: list[str] = field(default_factory=list)
    keep: bool = False  # leave the target's resources up after the run
    detach: bool = False  # return once the nodes are up; `dlinfra watch` follows the run later
    origin: Origin | None = None  # a rerun: the original's code bundle, pins and wheel
    upload: bool = True  # False: write nothing to the results store (`dlinfra plan --no-upload`)


@dataclass
class Snapshot:
    nodes: dict[str, NodeState | None]
    marker: Marker | None
    elapsed: float


@dataclass
class Outcome:
    run: Run
    state: str  # DONE | FAILED | STOPPED, or DETACHED (deploy --detach returned with the nodes up)
    metrics: Metrics | None = None
    failed_node: str | None = None
    error: str | None = None
    log_tail: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    seconds_to_first_step: float | None = None
    startup: list[tuple[str, float]] = field(default_factory=list)  # see dlinfra.runs.startup


def preview(
    spec: Spec, target: Target, spec_path: Path | None = None
) -> tuple[dict[str, NodeConfig], dict[str, str]]:
    """Every node's config and user-data as a deploy would render them, for a run named RUN_ID
    (`dlinfra render` and `validate`): nothing is created."""
    spec = absolute_dataset(spec, spec_path.absolute().parent if spec_path else Path.cwd())
    store = StoreConfig.for_run(spec, f"{spec.storage.url or 'file:///var/lib/dlinfra/store'}/RUN_ID")
    typed, rate = target.uses_instance_types, checked_rate(spec, target.hourly_cost(spec), target.name)
    configs = build_node_configs(
        spec, "RUN_ID", store, target.addresses(spec), typed=typed, usd_per_hour=rate
    )
    # the run's environment is resolved as a deploy would: a conflict is refused here already
    install = target.node_install(spec)
    env = Environment.of(spec, configs, install, None)
    boot = boot_install(spec, install, lambda name: f"{store.url}/code/{name}", env)
    return env.locked(configs), render_cluster(env.locked(configs), boot, target.user_data_limit)


def plan(request: Request, target: Target) -> tuple[Prepared, Review]:
    """Check, create the run and its user-data, and show what the target would create."""
    spec, origin = request.spec, request.origin
    for warning in target.capacity(spec):  # the same check and words as `dlinfra validate`
        target.options.log(f"warning: {warning}")
    target.preflight(spec)
    addresses = target.addresses(spec)  # before the run exists: a bad subnet creates nothing
    prepared = prepare(
        spec,
        addresses,
        target.node_install(spec, origin.wheel if origin else None),
        request.spec_path,
        request.argv,
        code=origin.code if origin else None,
        pins=origin.pins if origin else None,
        locks=origin.locks if origin else None,
        typed=target.uses_instance_types,
        usd_per_hour=checked_rate(spec, target.hourly_cost(spec), target.name),
        upload=request.upload,
        user_data_limit=target.user_data_limit,
    )
    for line in prepared.notes:
        target.options.log(line)
    for warning in prepared.warnings:
        target.options.log(f"warning: {warning}")
    if origin and origin.locks is None and (original := origin.pins.get("rerun_of")):
        changes = lock_changes(Run.open(original).manifest(), prepared.run.manifest())
        prepared.run.update_manifest(lock_changes=changes)
        target.options.log(
            f"lock refreshed: {len(changes)} package change(s) against {original}"
            + "".join(f"\n  {change}" for change in changes[:40])
        )
    return prepared, target.plan(prepared)


def deploy(
    request: Request,
    options: TargetOptions,
    approve: Callable[[str], bool],
    on_update: Callable[[Snapshot], None] = lambda s: None,
    started: float | None = None,
) -> Outcome:
    """Run the experiment on its target and always leave it torn down (unless `request.keep`).
    With `request.detach`, return once the nodes are up (state DETACHED): `attach` follows later."""
    target = target_for(request.spec.target, options)
    prepared, review = plan(request, target)
    run = prepared.run
    if (bundle := run.manifest().bundle) and bundle.files:
        shown = ", ".join(bundle.files[:20]) + (
            f" and {len(bundle.files) - 20} more" if len(bundle.files) > 20 else ""
        )
        options.log(f"code: {len(bundle.files)} files packed ({bundle.bytes} bytes): {shown}")
    if not review.needs_approval:
        options.log(review.text)
    elif not approve(review.text):
        run.update_manifest(status="CANCELLED")
        raise DlinfraError(f"apply cancelled; nothing was created. The plan stays in {run.dir}")

    def start() -> Cluster:
        target.provision(prepared, review)
        return target.start(prepared)

    lease = claim(prepared.store, "cli", cli_holder())
    assert isinstance(lease, Lease)  # a run nobody else has seen yet
    follow = _Follow(target, prepared, options, request.keep, lease.keep())
    return follow(start, on_update, started, request.detach)


def attach(
    run_id: str | None,
    options: TargetOptions,
    keep: bool = False,
    on_update: Callable[[Snapshot], None] = lambda s: None,
) -> Outcome:
    """Follow a run started earlier (`deploy --detach`) to its end, heal it, and tear it down.
    Ctrl-C here only stops watching: the run goes on."""
    run = Run.open(run_id)
    manifest = run.manifest()
    target = target_for(manifest.target, options)
    prepared = Prepared.load(run)
    started = datetime.fromisoformat(manifest.started).timestamp() if manifest.started else None
    started = started or time.time()
    while isinstance(lease := claim(prepared.store, "cli", cli_holder()), Owner):
        # another CLI or the controller acts for the run: follow it, and take it over if that owner
        # goes away before the run ends
        options.log(
            f"run {run.id} is owned by {lease.holder}: following it only (the owner heals and tears down)"
        )
        if (outcome := follow_only(prepared, on_update, started, until_unowned=True)) is not None:
            return outcome
        options.log(f"run {run.id}: its owner is gone; this watch takes the run over")
    follow = _Follow(target, prepared, options, keep, lease.keep())
    return follow(lambda: target.attach(prepared), on_update, started, attached=True)


@dataclass
class _Follow:
    """Follow a run as its owner: watch it, heal it, tear it down; give the lease up at the end."""

    target: Target
    prepared: Prepared
    options: TargetOptions
    keep: bool
    lease: Lease

    def __call__(
        self,
        get_cluster: Callable[[], Cluster],
        on_update: Callable[[Snapshot], None],
        started: float | None,
        detach: bool = False,
        attached: bool = False,
    ) -> Outcome:
        target, run, lease = self.target, self.prepared.run, self.lease
        tears_down = target.leaves_resources and not self.keep
        try:
            cluster = get_cluster()
            if detach:
                run.update_manifest(status="RUNNING", started=utc_now(), detached=True)
                run.publish_manifest()
                lease.release()  # whoever attaches next owns it
                return Outcome(run, "DETACHED")
            outcome = watch(
                self.prepared,
                cluster,
                on_update,
                started=started,
                stop_on_interrupt=not attached,
                lease=lease,
            )
        except BaseException as exc:
            if tears_down and lease.held:
                _teardown_after(exc, target, run, self.options)
            lease.release()
            raise
        if not lease.held:  # taken over mid-run: the new owner acts from here
            holder = _holder(self.prepared.store)
            self.options.log(
                f"run {run.id}: taken over by {holder}, which tears it down; this CLI only followed"
            )
            return outcome
        if tears_down and outcome.state != "DETACHED":
            self.options.log(_teardown(target, run))
        lease.release()
        return outcome


def _holder(store: RunStore) -> str:
    owner, _ = store.owner()
    return owner.holder if owner else "nobody"


def _teardown(target: Target, run: Run) -> str:
    try:
        return target.teardown(run)
    except DlinfraError as exc:
        raise RunFailed(
            f"run {run.id} ended, but its teardown failed: {exc}\n"
            f"Fix: retry it with `dlinfra destroy {run.id}`"
        ) from None


def _teardown_after(original: BaseException, target: Target, run: Run, options: TargetOptions) -> None:
    """Tear down after a failure; if that fails too, the original error still comes first and the
    teardown's failure rides along as a note (with how to retry it)."""
    try:
        options.log(target.teardown(run))
    except Exception as exc:
        original.add_note(f"teardown failed too: {exc}\nFix: retry it with `dlinfra destroy {run.id}`")


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
    try:
        while True:
            if lease is not None and not lease.held:
                left_running = True
                return follow_only(prepared, on_update, started) or Outcome(run, "DETACHED")
            # poll first: it may block (a heal's apply takes a minute), and a snapshot taken before it
            # would make every node look silent for that long (seen: a healed run failed as "lost")
            codes = cluster.poll()
            snap = _snapshot(store, names, started)
            on_update(snap)
            if snap.marker is not None:
                _let_nodes_finish(cluster, seconds=3 * poll + 5)
                on_update(_snapshot(store, names, started))
                break
            limits = prepared.spec.cluster
            if verdict := diagnose(snap.nodes, codes, limits.heartbeat_timeout, limits.stall_timeout):
                _fail(store, verdict, snap.nodes)
            elif codes and all(c == 0 for c in codes.values()):
                time.sleep(poll)  # the chief's marker may land right after its exit
                if store.marker() is None:
                    store.write_marker("FAILED", error="every node exited without a result")
            else:
                time.sleep(poll)
    except KeyboardInterrupt:
        if not stop_on_interrupt:  # `dlinfra watch`: Ctrl-C stops watching, not the run
            left_running = True
            return Outcome(run, "DETACHED")
        store.write_marker("STOPPED", reason="interrupted (Ctrl-C)")
        raise
    finally:
        if not left_running:
            _stop(cluster, run, store, names, ended_unwatched)
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
    devices = {name: st.devices for name, st in store.statuses(names).items() if st and st.devices}
    run.update_manifest(status=marker.marker if marker else "STOPPED", finished=finished, devices=devices)
    run.publish_manifest()


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
    stacks = None
    if verdict.wants_stacks:
        alive = [n for n, s in nodes.items() if s is not None and not s.finished]
        stacks = stack_summary(verdict, nodes, collect_stacks(store, alive))
        error += "; " + "; ".join(f"{name} {where}" for name, where in stacks.items())
    store.write_marker("FAILED", node=verdict.nodes[0], verdict=verdict.kind, error=error, stacks=stacks)


def _outcome(prepared: Prepared, store: RunStore, started: float, ended: float) -> Outcome:
    run = prepared.run
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
    if metrics and metrics.first_step_at:
        outcome.seconds_to_first_step = metrics.first_step_at - started
        statuses = store.statuses(run.manifest().nodes)
        outcome.startup = breakdown(statuses, metrics.strategy, started)
    if state == "FAILED" and outcome.failed_node:
        outcome.log_tail = run.node_log(outcome.failed_node)[-LOG_TAIL_LINES:]
    if metrics:
        run.update_manifest(metrics=metrics.summary())
    return outcome
