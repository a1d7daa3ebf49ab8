"""Views of recorded runs (status, logs, list, details), and their teardown through their target."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from dlinfra.errors import DlinfraError, StoreError
from dlinfra.node.masked_log import masker
from dlinfra.runs import restarts, versions
from dlinfra.runs.layout import RunStore
from dlinfra.runs.manifest import Manifest
from dlinfra.runs.ownership import Owned, acting, cli_holder, owner_of
from dlinfra.runs.preflight import figures
from dlinfra.runs.records import MARKERS, NO_MODEL, NO_MODEL_SAVED, Notice, Restart
from dlinfra.runs.run import Run, list_runs
from dlinfra.runs.startup import breakdown, describe
from dlinfra.spec.hardware import cluster_hardware
from dlinfra.targets import target_for, uses_instance_types


def run_status(run_id: str | None) -> dict[str, Any]:
    run = Run.open(run_id)
    manifest = run.manifest()
    store = run.store()
    now = time.time()
    nodes: dict[str, dict[str, Any] | None] = {}
    for name, st in store.statuses(manifest.nodes).items():
        nodes[name] = (
            None if st is None else st.model_dump() | {"heartbeat_age": round(now - st.heartbeat, 1)}
        )
    marker = store.marker()
    typed = uses_instance_types(manifest.target)
    roles = {
        role: {
            "count": hw.count,
            "instance_type": hw.instance_type if typed else None,
            "gpus": hw.gpus,
            "hardware": hw.describe(typed),
        }
        for role, hw in cluster_hardware(run.spec(), typed).items()
    }
    return {
        "run_id": run.id,
        "status": marker.marker if marker else manifest.status,
        "roles": roles,
        "nodes": nodes,
        "cost": run_cost(run, manifest),
        "stragglers": {name: s.says() for name, s in store.stragglers().named.items()},
    }


def run_cost(run: Run, manifest: Manifest) -> dict[str, Any]:
    """What the run has cost so far at its plan's prices (Manifest.usd_spent), and its cap."""
    return {
        "usd_spent": manifest.usd_spent(time.time()),
        "usd_per_hour": manifest.plan.usd_per_hour if manifest.plan else None,
        "max_cost": run.spec().cluster.max_cost,
    }


def follow_logs(run_id: str, node: str | None, follow: bool) -> Iterator[str]:
    run = Run.open(run_id)
    store = run.store()
    names = run.select_nodes(node)
    seen = dict.fromkeys(names, 0)
    mask = masker()  # a local node's log in the run dir is its own, unmasked (node.masked_log)
    while True:
        for name in names:
            lines = run.node_log(name)
            for line in map(mask, lines[seen[name] :]):
                yield line if node else f"{name} | {line}"
            seen[name] = len(lines)
        if not follow or store.marker() is not None:
            return
        time.sleep(1)


def _age(created: str | None) -> str:
    if not created:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(created)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


FINAL_STATUSES = (*MARKERS, "CANCELLED")


def list_run_rows() -> list[dict[str, Any]]:
    rows = []
    for run in list_runs():
        try:
            m = run.manifest()
        except StoreError:  # corrupt, or another dlinfra's record: list it, do not guess at its fields
            rows.append(
                dict.fromkeys(
                    ("created", "target", "strategy", "eval_accuracy", "usd_spent", "usd_per_hour", "owner")
                )
            )
            rows[-1]["resources_up"] = False
            rows[-1] |= {"run_id": run.id, "status": "unreadable (`dlinfra show` says why)", "age": "-"}
            continue
        if m.handed_over and (m.resources_up or m.status not in FINAL_STATUSES):
            m = _as_the_controller_left_it(run, m)
        status, accuracy = m.status, (m.metrics or {}).get("eval_accuracy")
        no_model = bool((m.metrics or {}).get("no_model"))
        # nobody watching a detached run: the store knows whether it ended
        if status == "RUNNING" and m.detached and (marker := run.store().marker()):
            status, accuracy = marker.marker, marker.eval_accuracy
            no_model = marker.reason == NO_MODEL_SAVED
        owner = _owner(run) if m.resources_up or status not in FINAL_STATUSES else None
        rows.append(
            {
                "run_id": run.id,
                "status": status,
                "age": _age(m.created),
                "created": m.created,
                "target": m.target,
                "strategy": m.strategy,
                "eval_accuracy": accuracy,
                "usd_spent": m.usd_spent(time.time()),
                # cloud resources still up (deployed with --keep or --detach): what they cost
                "usd_per_hour": (m.plan.usd_per_hour if m.plan else None) if m.resources_up else None,
                "resources_up": m.resources_up,
                "owner": owner,
                "note": NO_MODEL if status == "DONE" and no_model else None,  # a script that saved none
                "restarts": m.restarts,
            }
        )
    return rows


def _as_the_controller_left_it(run: Run, manifest: Manifest) -> Manifest:
    """A run handed to the controller: the controller publishes how it ended to the store, and
    this machine's copy of the manifest catches up from there."""
    stored = run.store().manifest()
    if stored is None or stored == manifest:
        return manifest
    run.write_manifest(stored)
    return stored


def _owner(run: Run) -> str | None:
    """Who acts for a live run now, if anyone (a store that cannot be read: nobody we can see)."""
    try:
        owner = owner_of(run.store())
    except StoreError:
        return None
    return owner.holder if owner else None


def run_details(run_id: str | None) -> dict[str, Any]:
    run = Run.open(run_id)
    manifest = run.manifest()
    store = run.store()
    metrics = store.metrics()
    # long series stay out of the view: `compare --plot` draws them
    shown = metrics.model_dump(exclude={"examples_per_sec_series", "loss_series"}) if metrics else {}
    tensorboard = store.tensorboard_uri()
    return {
        "run_id": run.id,
        "status": manifest.status,
        "run_dir": str(run.dir),
        "store": store.uri(),
        "model": store.model_uri() if metrics and not metrics.no_model else None,
        # a script that saved none: what it left instead, and where (its checkpoints, its model dir's files)
        **(
            {"no_model": f"{metrics.no_model}; {metrics.left_instead()}"}
            if metrics and metrics.no_model
            else {}
        ),
        "tensorboard": tensorboard,
        "tensorboard_command": f"tensorboard --logdir {tensorboard.removeprefix('file://')}"
        if tensorboard.startswith("file://")
        else f"aws s3 sync {tensorboard} tb/ && tensorboard --logdir tb/",
        **({"ami": manifest.ami_id} if manifest.ami_id else {}),
        **({"spot": spot_summary(metrics.interruptions, metrics.rebalances)} if metrics else {}),
        **({"restarts": [restarts.line(r) for r in found]} if (found := _restarts(store)) else {}),
        **({"startup": describe(steps)} if (steps := _startup(run)) else {}),
        **({"versions": versions.shown(_versions(manifest, store))} if manifest.versions else {}),
        **({"version_changes": manifest.version_changes} if manifest.version_changes else {}),
        **({"environment": _environment(manifest)} if manifest.environment else {}),
        **({"preflight": _preflight(store)} if store.preflight_rounds() else {}),
        "metrics": shown,
        "manifest": manifest.model_dump(mode="json"),
    }


def _versions(manifest: Manifest, store: RunStore) -> dict[str, str | None]:
    """The record's versions; for a run whose watcher has not recorded them yet (running, or
    followed by the account's controller), what its nodes report now, if any has."""
    if manifest.versions.get("source") != versions.PLANNED:
        return manifest.versions
    reports = {name: st.versions if st else None for name, st in store.statuses(manifest.nodes).items()}
    return versions.reported(manifest, reports)[0]


def _restarts(store: RunStore) -> list[Restart]:
    """The run's restarts as the chief (metrics) or the run's end (its marker) recorded them."""
    metrics, marker = store.metrics(), store.marker()
    return metrics.restarts if metrics else marker.restarts if marker else []


def _preflight(store: RunStore) -> dict[str, Any]:
    """The last round: its verdict and what each node measured (`show --json`; `show` draws a table)."""
    last = store.preflight_rounds()
    found, verdict = store.preflight_round(last)
    return {
        "round": last,
        "verdict": verdict.model_dump(mode="json") if verdict else None,
        "says": verdict.says() if verdict else None,
        "nodes": figures(list(found.values())),
    }


def _environment(manifest: Manifest) -> dict[str, str]:
    """Each flavor's lock and every package it pins, as `show` lists them."""
    return {
        flavor: f"lock {pin.sha256[:12]} ({pin.file}, {pin.platform}, {pin.index}); {len(pin.packages)} "
        f"packages: " + ", ".join(f"{name} {version}" for name, version in sorted(pin.packages.items()))
        for flavor, pin in sorted(manifest.environment.items())
    }


def _startup(run: Run) -> list[tuple[str, float]]:
    """Seconds from the command to each startup phase (nothing for runs recorded before phases)."""
    manifest = run.manifest()
    if manifest.command_started is None:
        return []
    statuses = run.store().statuses(manifest.nodes)
    return breakdown(statuses, manifest.strategy, manifest.command_started)


def destroy_run(run_id: str) -> str:
    """Tear the run down; one the account's controller owns is stopped instead, and its owner
    tears it down (two holders must never both destroy)."""
    run = Run.open(run_id)
    try:
        with acting(run.store(), run.id):
            return target_for(run.manifest().target).teardown(run)
    except Owned as owned:
        if owned.owner.kind != "controller":
            raise
        run.store().write_marker("STOPPED", reason=f"stopped by `dlinfra destroy` ({cli_holder()})")
        return (
            f"run {run.id}: STOPPED; its owner, {owned.owner.holder}, stops its nodes and tears it down "
            f"(`dlinfra watch {run.id}` follows it)"
        )


def destroy_ended() -> list[str]:
    """Tear down the cloud resources of every run that has ended (a final marker in its store)."""
    done = []
    for run in list_runs():
        try:
            manifest = run.manifest()
        except StoreError:
            continue
        if manifest.resources_up and run.store().marker() is not None:
            try:
                with acting(run.store(), run.id):
                    done.append(target_for(manifest.target).teardown(run))
            except Owned as owned:
                done.append(f"run {run.id}: left to its owner, {owned.owner.holder}")
    return done or ["no ended run has resources up"]


def consoles(run_id: str, node: str | None) -> Iterator[str]:
    """The serial consoles of a run's VMs (what EC2's get-console-output shows of an instance)."""
    run = Run.open(run_id)
    names = run.select_nodes(node)
    paths = {name: run.vm_dir(name) / "console.log" for name in names}
    if not any(p.is_file() for p in paths.values()):
        raise DlinfraError(
            f"run {run.id} has no VM consoles: only runs deployed with --emulate-instances=vm do"
        )
    for name, path in paths.items():
        if path.is_file():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                yield line if node else f"{name} | {line}"


def stored_stacks(run_id: str, node: str | None) -> Iterator[str]:
    """The stack dumps a frozen or stalled run left in its store."""
    run = Run.open(run_id)
    store = run.store()
    names = run.select_nodes(node)
    found = False
    for name in names:
        dump = store.stacks(name)
        if dump is None:
            continue
        found = True
        yield f"=== {name} ({store.stacks_uri(name)})"
        yield from dump[1].splitlines()
    if not found:
        yield f"run {run.id} has no stack dumps (taken when a run freezes or stalls, or by `dlinfra debug`)"


def live_stacks(run_id: str | None, node: str | None) -> Iterator[str]:
    """Ask a live run's beacons for their trainers' stacks, and print what comes back."""
    from dlinfra.runs.diagnosis import collect_stacks

    run = Run.open(run_id)
    store = run.store()
    if (marker := store.marker()) is not None:
        raise DlinfraError(f"run {run.id} has ended ({marker.marker}). Fix: `dlinfra logs {run.id} --stacks`")
    names = run.select_nodes(node)
    dumps = collect_stacks(store, names)
    for name in names:
        if name in dumps:
            yield f"=== {name}"
            yield from dumps[name].splitlines()
        else:
            yield f"=== {name}: no answer (its beacon is not running, or py-spy could not read the trainer)"


def spot_summary(interruptions: list[Notice], rebalances: int) -> str:
    """One line of a run's spot notices: how many, how much of the notice the nodes used, steps lost."""
    if not interruptions:
        return f"no interruptions, {rebalances} rebalance recommendations"
    used = [n.seconds_used for n in interruptions if n.seconds_used is not None]
    lost = sum(n.steps_lost or 0 for n in interruptions)
    return (
        f"{len(interruptions)} interruptions ({', '.join(n.node for n in interruptions)}), "
        f"{max(used, default=0):.1f}s of notice used at most, {lost} steps lost past the notices, "
        f"{rebalances} rebalance recommendations"
    )
