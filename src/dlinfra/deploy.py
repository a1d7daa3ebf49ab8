"""Deploying a spec: prepare the run and its user-data, start the nodes, watch the store, tear down.

One flow for every target; a target only starts and stops nodes (see `Cluster`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dlinfra.bundle import Bundle, file_sha256, pack_entrypoint
from dlinfra.node.status import run_marker, write_marker
from dlinfra.render import AddressPlan, NodeConfig, build_node_configs, plan_addresses, render_cluster
from dlinfra.render.node_config import store_config
from dlinfra.run import Run, package_version, utc_now
from dlinfra.spec import Spec
from dlinfra.store import Store

LOG_TAIL_LINES = 30
REPLACE_GRACE = 900.0  # a replacement instance boots and installs TensorFlow before its first beat


class Cluster(Protocol):
    """How a target's nodes are supervised; the store tells everything else."""

    def poll(self) -> dict[str, int | None]:
        """Heal what the target can heal (restart a process, replace an instance); return the exit
        codes of nodes it knows have ended for good (None: still running)."""
        ...

    def exit_codes(self) -> dict[str, int | None]: ...

    def stop(self) -> None: ...


@dataclass
class Prepared:
    run: Run
    plan: AddressPlan
    configs: dict[str, NodeConfig]
    user_data: dict[str, str]

    @property
    def store(self) -> Store:
        return run_store(self.run)


def prepare(
    spec: Spec,
    spec_path: Path | None = None,
    argv: list[str] | None = None,
    install: str | None = None,
    target: str | None = None,
    code: Bundle | None = None,
    pins: dict[str, Any] | None = None,
    wheel: Path | None = None,
) -> Prepared:
    """Create the run record, store the code bundle, render every node's user-data into the run dir.
    `code` (a rerun's pinned bundle) replaces packing the entrypoint's directory; `pins` are extra
    manifest fields (e.g. `rerun_of`)."""
    plan = plan_addresses(spec, target)  # before the run exists: a bad subnet creates nothing
    base = spec_path.absolute().parent if spec_path else Path.cwd()
    if code is None and spec.training.entrypoint:
        code = pack_entrypoint(spec.training.entrypoint, base)
    dataset = dataset_pin(spec, base)
    run = Run.create(spec, spec_path, argv)
    store = run_store(run)
    (run.dir / "code").mkdir()
    if code is not None:
        store.put_bytes(code.key, code.data)
        (run.dir / "code" / Path(code.key).name).write_bytes(code.data)
    wheel_pin = None
    if wheel is not None:  # cloud nodes install exactly this wheel, from the run's store
        store.put_file(f"code/{wheel.name}", wheel)
        shutil.copy2(wheel, run.dir / "code" / wheel.name)
        install = store.uri(f"code/{wheel.name}")
        wheel_pin = {"name": wheel.name, "sha256": file_sha256(wheel), "uri": install}
    configs = build_node_configs(spec, run.id, run.manifest()["store_url"], plan, code)
    user_data = render_cluster(configs, install)
    out = run.dir / "user-data"
    out.mkdir()
    for name, text in user_data.items():
        (out / f"{name}.yaml").write_text(text, encoding="utf-8")
    run.update_manifest(
        nodes=sorted(user_data),
        addresses=plan.cluster(),
        bundle=code.pin() if code else None,
        wheel=wheel_pin,
        install=install,
        dataset=dataset,
        seeds={"seed": spec.training.seed, "deterministic": spec.training.deterministic},
        **(pins or {}),
    )
    publish_manifest(run, store)
    return Prepared(run, plan, configs, user_data)


def dataset_pin(spec: Spec, base: Path) -> dict[str, Any]:
    """What identifies the training data: built-in sets by their package version, a URI by sha256
    (computed here for a local file the spec did not pin; None when nothing can pin it)."""
    ds = spec.training.dataset
    pin: dict[str, Any] = {"format": ds.format, "uri": ds.uri, "sha256": ds.sha256}
    if ds.format == "digits":
        pin["source"] = f"scikit-learn {package_version('scikit-learn')}"
    elif ds.format == "synthetic":
        pin["source"] = f"generated from training.seed {spec.training.seed}"
    elif ds.sha256 is None and ds.uri and ds.uri.startswith("file://"):
        local = Path(ds.uri[len("file://") :])
        local = local if local.is_absolute() else base / local
        if local.is_file():
            pin["sha256"] = file_sha256(local)
    pin["pinned"] = ds.format != "cifar10" or pin["sha256"] is not None
    return pin


def publish_manifest(run: Run, store: Store) -> None:
    """The manifest travels with the results: a run can be rerun from its store alone."""
    store.put_json("manifest.json", run.manifest())


@dataclass
class Snapshot:
    nodes: dict[str, dict[str, Any] | None]
    marker: tuple[str, dict[str, Any]] | None
    lost: list[str]
    elapsed: float


@dataclass
class Outcome:
    run: Run
    state: str  # DONE | FAILED | STOPPED
    metrics: dict[str, Any] | None = None
    failed_node: str | None = None
    error: str | None = None
    log_tail: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    seconds_to_first_step: float | None = None


def watch(
    prepared: Prepared,
    cluster: Cluster,
    on_update: Callable[[Snapshot], None] = lambda s: None,
    heartbeat_timeout: float = 60.0,
    poll: float = 1.0,
    started: float | None = None,
) -> Outcome:
    """Follow the run through the store until it ends; always tears the cluster down."""
    store, run = prepared.store, prepared.run
    started = started or time.time()
    run.update_manifest(status="RUNNING", started=utc_now())
    try:
        while True:
            snap = _snapshot(store, list(prepared.user_data), heartbeat_timeout, started)
            on_update(snap)
            if snap.marker is not None:
                _let_nodes_finish(cluster, seconds=3 * poll + 5)
                on_update(_snapshot(store, list(prepared.user_data), heartbeat_timeout, started))
                break
            codes = cluster.poll()
            crashed = {n: c for n, c in codes.items() if c not in (None, 0)}
            if crashed:
                name, code = sorted(crashed.items())[0]
                write_marker(store, "FAILED", node=name, error=f"node process exited with code {code}")
            elif snap.lost:
                # A node blocked on a frozen peer inside TensorFlow goes quiet too: name every silent one.
                silent = ", ".join(snap.lost)
                write_marker(
                    store,
                    "FAILED",
                    node=snap.lost[0],
                    error=f"no heartbeat for {heartbeat_timeout:.0f}s from {silent} (hung or unreachable)",
                )
            elif codes and all(c == 0 for c in codes.values()):
                time.sleep(poll)  # the chief's marker may land right after its exit
                if run_marker(store) is None:
                    write_marker(store, "FAILED", node=None, error="every node exited without a result")
            else:
                time.sleep(poll)
    except KeyboardInterrupt:
        write_marker(store, "STOPPED", node=None, reason="interrupted (Ctrl-C)")
        raise
    finally:
        cluster.stop()
        marker = run_marker(store)
        run.update_manifest(status=marker[0] if marker else "STOPPED", finished=utc_now())
        publish_manifest(run, store)
    return _outcome(prepared, store, started)


def _let_nodes_finish(cluster: Cluster, seconds: float) -> None:
    """Servers notice the marker on their next poll and record their final state themselves."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(c is None for c in cluster.exit_codes().values()):
        time.sleep(0.2)


def _snapshot(store: Store, names: list[str], heartbeat_timeout: float, started: float) -> Snapshot:
    now = time.time()
    nodes = {name: store.get_json(f"status/{name}.json") for name in names}
    lost = sorted(  # the longest silent first
        (
            name
            for name, st in nodes.items()
            if st
            and st.get("state") not in ("done", "failed", "stopped")
            and now - st["heartbeat"]
            > heartbeat_timeout + (REPLACE_GRACE if st.get("state") == "replacing" else 0)
        ),
        key=lambda name: nodes[name]["heartbeat"],  # type: ignore[index]
    )
    return Snapshot(nodes, run_marker(store), lost, now - started)


def _outcome(prepared: Prepared, store: Store, started: float) -> Outcome:
    run = prepared.run
    marker = run_marker(store)
    state, body = marker if marker else ("STOPPED", {})
    metrics = store.get_json("metrics.json") if state == "DONE" else None
    error = body.get("error") or body.get("reason")
    if body.get("last_checkpoint"):  # what a STOPPED run can be resumed or inspected from
        error = f"{error}; last checkpoint {store.uri('checkpoints/' + body['last_checkpoint'])}"
    outcome = Outcome(run, state, metrics, body.get("node"), error)
    outcome.wall_seconds = time.time() - started
    if metrics and metrics.get("first_step_at"):
        outcome.seconds_to_first_step = metrics["first_step_at"] - started
    if state == "FAILED" and outcome.failed_node:
        outcome.log_tail = node_log(run, store, outcome.failed_node)[-LOG_TAIL_LINES:]
    if metrics:
        run.update_manifest(
            metrics={k: metrics.get(k) for k in ("eval_accuracy", "steps", "train_seconds", "model_uri")}
        )
    return outcome


def node_log(run: Run, store: Store | None, node: str) -> list[str]:
    """A node's log: from the run dir when the node ran here, else from the store."""
    local = run.dir / "logs" / f"{node}.log"
    if local.is_file():
        return local.read_text(encoding="utf-8", errors="replace").splitlines()
    data = store.get_bytes(f"logs/{node}.log") if store else None
    return data.decode("utf-8", errors="replace").splitlines() if data else []


def run_store(run: Run) -> Store:
    """The store of a recorded run, configured as its nodes were."""
    cfg = store_config(run.spec(), run.manifest()["store_url"])
    return Store.from_url(cfg.url, cfg.endpoint_url, cfg.region)
