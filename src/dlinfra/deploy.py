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
from dlinfra.environment.lock import Flavor, Lock
from dlinfra.errors import DlinfraError, RunFailed
from dlinfra.pinned_data import absolute_dataset
from dlinfra.prepare import Environment, NodeInstall, Prepared, boot_install, checked_rate, prepare
from dlinfra.render import AddressPlan, build_node_configs, check_fits, render_cluster
from dlinfra.render.configs import settle_preflight
from dlinfra.runs import preflight_history
from dlinfra.runs.compare import lock_changes
from dlinfra.runs.handover import controller_note, hand_over
from dlinfra.runs.layout import RunStore
from dlinfra.runs.layout.controller import ControllerStore
from dlinfra.runs.ownership import Lease, claim, cli_holder
from dlinfra.runs.records import Owner
from dlinfra.runs.run import Run, home, utc_now
from dlinfra.sizing.record import predict_run
from dlinfra.spec.model import Spec
from dlinfra.targets import target_for
from dlinfra.targets.base import Cluster, Review, Target, TargetOptions
from dlinfra.watching import Outcome, Snapshot, follow_only, watch

if TYPE_CHECKING:
    from dlinfra.runs.rerun import Origin


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
    refresh_lock: bool = False  # resolve the environment anew, not from this machine's lock cache


def preview(
    spec: Spec, target: Target, spec_path: Path | None = None
) -> tuple[dict[str, NodeConfig], dict[str, str]]:
    """Every node's config and user-data as a deploy would render them, for a run named RUN_ID
    (`dlinfra render` and `validate`): nothing is created."""
    spec = absolute_dataset(spec, spec_path.absolute().parent if spec_path else Path.cwd())
    store = StoreConfig.for_run(spec, f"{spec.storage.url or 'file:///var/lib/dlinfra/store'}/RUN_ID")
    typed, rate = target.uses_instance_types, checked_rate(spec, target.hourly_cost(spec), target.name)
    configs = build_node_configs(
        spec,
        "RUN_ID",
        store,
        target.addresses(spec),
        typed=typed,
        own_machines=target.own_machines,
        usd_per_hour=rate,
    )
    check_fits(configs, target.user_data_limit)  # a user-data too big is refused before the resolver runs
    # the run's environment is resolved as a deploy would: a conflict is refused here already
    install = target.node_install(spec)
    env = Environment.of(spec, configs, install, None, fresh=False)
    env.check_imports(spec, spec_path.absolute().parent if spec_path else Path.cwd())
    boot = boot_install(spec, install, lambda name: f"{store.url}/code/{name}", env)
    return env.locked(configs), render_cluster(env.locked(configs), boot, target.user_data_limit)


def plan(request: Request, target: Target) -> tuple[Prepared, Review]:
    """Check, create the run and its user-data, and show what the target would create."""
    spec, origin = request.spec, request.origin
    for warning in target.capacity(spec):  # the same check and words as `dlinfra validate`
        target.options.log(f"warning: {warning}")
    target.preflight(spec)
    addresses = target.addresses(spec)  # before the run exists: a bad subnet creates nothing
    install = target.node_install(spec, origin.wheel if origin else None)
    locks = origin.locks if origin else None
    spec, locks, settled = _settle(spec, target, addresses, install, locks, request.refresh_lock)
    # the run's spec (and so a rerun's, on whatever machines) says what its nodes checked
    spec = settle_preflight(spec, target.uses_instance_types, target.own_machines)
    if settled:
        target.options.log(settled)
    prepared = prepare(
        spec,
        addresses,
        install,
        request.spec_path,
        request.argv,
        code=origin.code if origin else None,
        pins=origin.pins if origin else None,
        locks=locks,
        typed=target.uses_instance_types,
        own_machines=target.own_machines,
        usd_per_hour=checked_rate(spec, target.hourly_cost(spec), target.name),
        upload=request.upload,
        user_data_limit=target.user_data_limit,
        fresh_lock=request.refresh_lock,
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


def _settle(
    spec: Spec,
    target: Target,
    addresses: AddressPlan,
    install: NodeInstall,
    locks: dict[Flavor, Lock] | None,
    fresh: bool,
) -> tuple[Spec, dict[Flavor, Lock] | None, str | None]:
    """Target.settle, with the run's environment resolved only if the target asks for it (then once:
    prepare takes the locks as they are)."""
    probe = build_node_configs(
        spec,
        "RUN_ID",
        StoreConfig(url="file:///RUN_ID"),
        addresses,
        typed=target.uses_instance_types,
        own_machines=target.own_machines,
    )
    resolved = [locks] if locks is not None else []

    def digests() -> dict[str, str]:
        if not resolved:
            resolved.append(Environment.of(spec, probe, install, None, fresh).locks)
        return {flavor: lock.sha256 for flavor, lock in resolved[0].items()}

    settled, line = target.settle(spec, probe, digests)
    return settled, resolved[0] if resolved else None, line


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
        preflight_history.snapshot(prepared.spec, prepared.configs, prepared.store)
        try:
            predict_run(prepared.spec, prepared.store, home())
        except DlinfraError as exc:  # the advisor only ever informs: its history may be unreachable
            options.log(f"warning: no sizing prediction for this run: {exc}")
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
    prepared = Prepared.load(run)
    started = _started(run)
    while isinstance(lease := claim(prepared.store, "cli", cli_holder()), Owner):
        # another CLI or the controller acts for the run: follow it, and take it over if that owner
        # goes away before the run ends
        options.log(
            f"run {run.id} is owned by {lease.holder}: following it only (the owner heals and tears down)"
        )
        if (outcome := follow_only(prepared, on_update, started, until_unowned=True)) is not None:
            return outcome
        options.log(f"run {run.id}: its owner is gone; this watch takes the run over")
    return act_for(prepared, lease, options, keep, on_update)


def act_for(
    prepared: Prepared,
    lease: Lease,
    options: TargetOptions,
    keep: bool = False,
    on_update: Callable[[Snapshot], None] = lambda s: None,
) -> Outcome:
    """Own a started run to its end under `lease` (a CLI's, or the controller's): heal it, record
    its verdict, tear it down."""
    target = target_for(prepared.run.manifest().target, options)
    follow = _Follow(target, prepared, options, keep, lease.keep())
    return follow(lambda: target.attach(prepared), on_update, _started(prepared.run), attached=True)


def _started(run: Run) -> float:
    manifest = run.manifest()
    return datetime.fromisoformat(manifest.started).timestamp() if manifest.started else time.time()


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
            try:
                cluster = get_cluster()
            except BaseException as exc:
                if not attached:  # `dlinfra watch` failing to attach says nothing of the run itself
                    _never_started(self.prepared, exc)
                raise
            # a run handed to the account's controller outlives this CLI (attached: already an owner)
            controller = None if attached else target.controller(self.prepared.spec)
            if detach or controller is not None:
                run.update_manifest(status="RUNNING", started=utc_now(), detached=detach)
                if controller is None:
                    run.publish_manifest()
                    lease.release()  # whoever attaches next owns it
                    return Outcome(run, "DETACHED")
                self._hand_over(controller)
                if detach:
                    return Outcome(run, "HANDED_OVER")
                self.options.log(
                    f"run {run.id}: following it here; Ctrl-C stops only this view (the controller goes on; "
                    f"`dlinfra destroy {run.id}` stops the run)"
                )
                followed = follow_only(self.prepared, on_update, started or time.time())
                if followed is None or followed.state == "DETACHED":  # Ctrl-C: the run goes on there
                    return Outcome(run, "HANDED_OVER")
                return followed
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

    def _hand_over(self, controller: ControllerStore) -> None:
        target, run = self.target, self.prepared.run
        target.ready_for_controller(run)
        # a controller on a machine of its own (EC2, or a VM standing in) reaches no process here
        info = controller.info()
        emulated = self.options.emulate_instances if info and info.emulated == "process" else None
        hand_over(
            run, self.prepared.store, controller, self.lease, keep=self.keep, emulate_instances=emulated
        )
        # started just now: its record says `stopped` until its first look, which is no news
        if not target.wake_controller(self.prepared.spec, controller) and (
            note := controller_note(controller)
        ):
            self.options.log(note)


def _never_started(prepared: Prepared, exc: BaseException) -> None:
    """A deploy that ended while it provisioned or started the nodes: the run ends there, as the
    watcher would have ended it (its marker, then its manifest), or `dlinfra runs` would show it
    CREATED or APPLIED forever."""
    store, run = prepared.store, prepared.run
    try:
        if store.marker() is None:
            if isinstance(exc, KeyboardInterrupt):
                store.write_marker("STOPPED", reason="interrupted (Ctrl-C) before the nodes were up")
            else:
                store.write_marker("FAILED", error=f"the cluster did not start: {exc}"[:2000])
        marker = store.marker()
        run.update_manifest(status=marker.marker if marker else "STOPPED", finished=utc_now())
    except Exception as unrecorded:  # the store may be why it failed: the original error comes first
        exc.add_note(f"the run's end was not recorded: {unrecorded}")


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
    except KeyboardInterrupt:  # a second Ctrl-C: leave now, and say what may still be billing
        original.add_note(
            f"teardown interrupted: what it had not yet removed may still run and bill.\n"
            f"Fix: `dlinfra destroy {run.id}` finishes it"
        )
    except Exception as exc:
        original.add_note(f"teardown failed too: {exc}\nFix: retry it with `dlinfra destroy {run.id}`")
