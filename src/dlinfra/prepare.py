"""Preparing a run: the run record, its code in the store, and one cloud-init user-data per node.

Everything here is the same for every target; a target only contributes where nodes listen
(the address plan) and what they install.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlinfra import __version__
from dlinfra.contract import NodeConfig, StoreConfig
from dlinfra.environment import imports, lock_cache
from dlinfra.environment.lock import PYPI, Flavor, Index, Lock, Platform
from dlinfra.errors import DlinfraError, SpecError
from dlinfra.pinned_data import absolute_dataset, dataset_pin, pinned_shards
from dlinfra.render import (
    AddressPlan,
    Install,
    Node,
    build_node_configs,
    node_config_from_user_data,
    render_cluster,
)
from dlinfra.runs import versions
from dlinfra.runs.bundle import Bundle, code_files, code_root, file_sha256, pack_code
from dlinfra.runs.layout import RunStore
from dlinfra.runs.layout.pins import bundle_key, data_listing_key
from dlinfra.runs.manifest import EnvironmentPin, WheelPin
from dlinfra.runs.run import Run, home, seconds_per_step
from dlinfra.runs.wheel import BuildingWheel
from dlinfra.spec.model import Spec
from dlinfra.spec.pricing import FirstCheckpoint, HourlyCost, budget_problem


@dataclass(frozen=True)
class NodeInstall:
    """What a node runs and where: this run's dlinfra wheel (None: the release `requirement` names,
    from the index; a checkout's may still be building) on top of the run's lock, resolved for
    `platform`. `boots`: nodes install at boot from their user-data (instances); else this machine
    makes their environment (processes)."""

    requirement: str | None = None
    built: Path | BuildingWheel | None = None
    platform: Platform = field(default_factory=Platform.here)
    boots: bool = True

    @property
    def wheel(self) -> Path | None:
        """The wheel, once its build is done."""
        return self.built.result() if isinstance(self.built, BuildingWheel) else self.built

    @property
    def lock_source(self) -> str:
        """What the lock resolves dlinfra from (environment/lock.resolve): a checkout's
        pyproject.toml while its wheel builds, the wheel itself, or the release's version."""
        if isinstance(self.built, BuildingWheel):
            return str(self.built.pyproject)
        return str(self.built) if self.built else (self.requirement or "").partition("==")[2]


@dataclass
class Prepared:
    spec: Spec
    run: Run
    plan: AddressPlan
    configs: dict[str, NodeConfig]
    user_data: dict[str, str]
    upload: bool = True  # False: nothing was (or may be) written to the results store
    warnings: tuple[str, ...] = ()  # what the user should hear before the run starts
    notes: tuple[str, ...] = ()  # what the nodes will do that the plan does not show (the data they stage)

    @property
    def store(self) -> RunStore:
        return self.run.store()

    @classmethod
    def load(cls, run: Run) -> Prepared:
        """A recorded run as it was prepared: its spec and user-data from the run dir."""
        user_data = {
            p.stem: p.read_text(encoding="utf-8") for p in sorted((run.dir / "user-data").glob("*.yaml"))
        }
        configs = {name: node_config_from_user_data(text) for name, text in user_data.items()}
        nodes = []
        for cfg in configs.values():
            host, _, port = cfg.address.rpartition(":")
            nodes.append(Node(cfg.role, cfg.index, host, int(port)))
        dispatcher = next((cfg.dispatcher for cfg in configs.values() if cfg.dispatcher), None)
        return cls(run.spec(), run, AddressPlan(tuple(nodes), dispatcher=dispatcher), configs, user_data)


def prepare(
    spec: Spec,
    plan: AddressPlan,
    install: NodeInstall,
    spec_path: Path | None = None,
    argv: list[str] | None = None,
    code: Bundle | None = None,
    pins: dict[str, Any] | None = None,
    locks: dict[Flavor, Lock] | None = None,
    *,
    typed: bool,
    own_machines: bool = False,
    usd_per_hour: float = 0.0,
    upload: bool = True,
    user_data_limit: int | None = None,
    fresh_lock: bool = False,
) -> Prepared:
    """Create the run record, store the code bundle, render every node's user-data into the run dir.
    `code` (a rerun's pinned bundle) replaces packing the entrypoint's directory; `pins` are extra
    manifest fields (e.g. `rerun_of`); `locks` (a rerun's) replace resolving the environment anew;
    `typed`: the target runs nodes on their instance types; `own_machines`: each on its own machine.
    `upload=False` (a plan for review by a read-only role) writes the run dir alone: the user-data
    names the wheel's store URI, but nothing goes to the store. A spec whose user-data would exceed
    `user_data_limit` leaves nothing behind: it is rendered before anything is stored. `fresh_lock`:
    resolve the environment anew rather than take this machine's lock for the same inputs."""
    base = spec_path.absolute().parent if spec_path else Path.cwd()
    packed_here = code is None  # else a rerun's pinned bundle, whose imports its original ran
    if code is None:
        code = pack_code(spec.training, base, home())
    spec, data_note, listing = pinned_shards(absolute_dataset(spec, base), own_disks=typed)
    dataset = dataset_pin(spec)
    # The flavors its nodes run, before the run exists: an environment that cannot be resolved is
    # refused (exit 2) with nothing created. Building configs is cheap; resolving is not.
    probe = build_node_configs(
        spec, "RUN_ID", StoreConfig(url="file:///RUN_ID"), plan, typed=typed, own_machines=own_machines
    )
    env = Environment.of(spec, probe, install, locks, fresh_lock)
    if packed_here:
        env.check_imports(spec, base)
    wheel = install.wheel  # built beside the lock; a failed build creates no run
    run = Run.create(spec, spec_path, argv)
    store = run.store()
    wheel_pin = None
    if wheel is not None:  # nodes install exactly this wheel, from the run's store
        wheel_pin = WheelPin(name=wheel.name, sha256=file_sha256(wheel), uri=store.wheel_uri(wheel.name))
    configs = env.locked(
        build_node_configs(
            spec,
            run.id,
            run.manifest().store,
            plan,
            code,
            typed=typed,
            own_machines=own_machines,
            usd_per_hour=usd_per_hour,
        )
    )
    boot = boot_install(spec, install, store.lock_uri, env)
    try:
        user_data = render_cluster(configs, boot, user_data_limit)
    except SpecError:
        shutil.rmtree(run.dir)
        raise
    (run.dir / "code").mkdir()
    for lock in env.locks.values():
        if upload:
            store.put_lock(lock.file_name, lock.text)
        (run.dir / "code" / lock.file_name).write_text(lock.text, encoding="utf-8")
    if code is not None:
        if upload:
            store.put_bundle(code.sha256, code.data)
        (run.dir / bundle_key(code.sha256)).write_bytes(code.data)
    if listing is not None:
        sha256 = spec.training.dataset.sha256
        assert sha256 is not None
        if upload:
            store.put_data_listing(sha256, listing)
        (run.dir / data_listing_key(sha256)).write_bytes(listing)
    if wheel is not None:
        if upload:
            store.put_wheel(wheel)
        shutil.copy2(wheel, run.dir / "code" / wheel.name)
    out = run.dir / "user-data"
    out.mkdir()
    for name, text in user_data.items():
        (out / f"{name}.yaml").write_text(text, encoding="utf-8")
    run.update_manifest(
        nodes=sorted(user_data),
        addresses=plan.cluster(),
        bundle=code.pin() if code else None,
        wheel=wheel_pin,
        install=boot.source if boot else None,
        environment=(lock_pins := env.pins(store.lock_uri)),
        versions=versions.planned(lock_pins),
        dataset=dataset,
        seeds={"seed": spec.training.seed, "deterministic": spec.training.deterministic},
        **(pins or {}),
    )
    if upload:
        run.publish_manifest()
    field = "training.command" if spec.training.command else "training.entrypoint"
    warnings = tuple(code.warnings(field)) if code else ()
    notes = ((data_note,) if data_note else ()) + env.notes()
    return Prepared(spec, run, plan, configs, user_data, upload, warnings, notes)


def checked_rate(spec: Spec, cost: HourlyCost, target: str) -> float:
    """The cluster's price per hour (Target.hourly_cost), refusing (exit 2) a cluster.max_cost it could
    not keep: one that runs out before the first checkpoint, or prices that are not all known."""
    first = FirstCheckpoint.estimate(spec.training.checkpoint_every, seconds_per_step(spec.name, target))
    if problem := budget_problem(spec.cluster.max_cost, cost, first):
        raise SpecError([problem])
    return cost.known


@dataclass(frozen=True)
class Environment:
    """The run's locks (one per flavor its nodes run) and the index they were resolved from."""

    locks: dict[Flavor, Lock]
    index: Index

    @classmethod
    def of(
        cls,
        spec: Spec,
        configs: dict[str, NodeConfig],
        install: NodeInstall,
        locks: dict[Flavor, Lock] | None,
        fresh: bool,
    ) -> Environment:
        """`locks` (a rerun's) are taken as they are; else each flavor is taken from what this
        machine resolved last for the same inputs (lock_cache), or resolved now (`fresh`, or none
        cached)."""
        index = node_index(spec, install)
        if locks is None:
            flavors = sorted({cfg.flavor for cfg in configs.values()})
            script = spec.training.command is not None
            locks = {
                f: lock_cache.locked(
                    install.lock_source, spec.training.requirements, f, install.platform, index, script, fresh
                )
                for f in flavors
            }
        return cls(locks, index)

    def check_imports(self, spec: Spec, base: Path) -> None:
        """Refuse (exit 2) code that imports a module none of the locks provides (environment.imports)."""
        if root := code_root(spec.training, base):
            packed = [path for path in code_files(root, home()) if path.suffix == ".py"]
            imports.check(root, self.locks.values(), packed)

    def notes(self) -> tuple[str, ...]:
        """How a lock came to be when not from the index's answer just now: the run's log says so."""
        locks = sorted(self.locks.items())
        return tuple(f"environment ({flavor}): {lock.note}" for flavor, lock in locks if lock.note)

    def locked(self, configs: dict[str, NodeConfig]) -> dict[str, NodeConfig]:
        """Each node's config naming the lock it must run."""
        return {
            n: c.model_copy(update={"lock_sha256": self.locks[c.flavor].sha256}) for n, c in configs.items()
        }

    def pins(self, code_uri: Callable[[str], str]) -> dict[str, EnvironmentPin]:
        return {
            flavor: EnvironmentPin(
                file=lock.file_name,
                sha256=lock.sha256,
                uri=code_uri(lock.file_name),
                platform=str(lock.platform),
                index=self.index.shown(),
                packages=lock.pins(),
            )
            for flavor, lock in sorted(self.locks.items())
        }


def boot_install(
    spec: Spec, install: NodeInstall, code_uri: Callable[[str], str], env: Environment
) -> Install | None:
    """What the user-data tells a booting node to install (nothing for local processes): its lock,
    then this run's wheel (by its store URI under code/) or, without one, the release in the lock."""
    if not install.boots:
        return None
    source = code_uri(install.wheel.name) if install.wheel else install.requirement
    index = env.index
    return Install(
        source or "",
        file_sha256(install.wheel) if install.wheel else None,
        spec.aws.pip_index_url or (index.url if index.url != PYPI else None),
        spec.aws.pip_extra_ca,
        {flavor: (code_uri(lock.file_name), lock.sha256) for flavor, lock in env.locks.items()},
        index.extra,
    )


def release_requirement() -> str:
    """What nodes install when there is no wheel to ship: exactly this dlinfra release."""
    return f"dlinfra=={__version__}"


def node_index(spec: Spec, install: NodeInstall) -> Index:
    """The index the run resolves from, and its nodes install from. Booting nodes read it from
    their user-data, so an index with credentials in it (from PIP_INDEX_URL, say) is refused."""
    index = Index.of(spec.aws.pip_index_url, spec.aws.pip_extra_ca, os.environ)
    if install.boots and index.has_credentials():
        raise DlinfraError(
            f"the package index ({index.shown()}) carries credentials, which would be written into "
            "every node's user-data. Fix: give the nodes an index they reach without credentials in "
            "its URL (aws.pip_index_url, e.g. a mirror inside the VPC), or run on the local target"
        )
    return index
