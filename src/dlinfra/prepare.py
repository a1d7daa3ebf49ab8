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
from dlinfra.environment.lock import PYPI, Flavor, Index, Lock, Platform, resolve
from dlinfra.errors import DlinfraError, SpecError
from dlinfra.render import (
    AddressPlan,
    Install,
    Node,
    build_node_configs,
    node_config_from_user_data,
    render_cluster,
)
from dlinfra.runs.bundle import Bundle, file_sha256, pack_code
from dlinfra.runs.layout import RunStore, bundle_key, data_listing_key
from dlinfra.runs.records import EnvironmentPin, WheelPin
from dlinfra.runs.run import Run, home, package_version
from dlinfra.runs.store import Store
from dlinfra.spec.catalog import catalog
from dlinfra.spec.dataset import is_listing
from dlinfra.spec.model import Spec
from dlinfra.training import staging, streaming
from dlinfra.training.listing import listed_manifest, listing_bytes, listing_sha256


@dataclass(frozen=True)
class NodeInstall:
    """What a node runs and where: this run's dlinfra wheel (None: the release `requirement` names,
    from the index) on top of the run's lock, resolved for `platform`. `boots`: nodes install at
    boot from their user-data (instances); else this machine makes their environment (processes)."""

    requirement: str | None = None
    wheel: Path | None = None
    platform: Platform = field(default_factory=Platform.here)
    boots: bool = True


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
    upload: bool = True,
    user_data_limit: int | None = None,
) -> Prepared:
    """Create the run record, store the code bundle, render every node's user-data into the run dir.
    `code` (a rerun's pinned bundle) replaces packing the entrypoint's directory; `pins` are extra
    manifest fields (e.g. `rerun_of`); `locks` (a rerun's) replace resolving the environment anew;
    `typed`: the target runs nodes on their instance types.
    `upload=False` (a plan for review by a read-only role) writes the run dir alone: the user-data
    names the wheel's store URI, but nothing goes to the store. A spec whose user-data would exceed
    `user_data_limit` leaves nothing behind: it is rendered before anything is stored."""
    base = spec_path.absolute().parent if spec_path else Path.cwd()
    if code is None:
        code = pack_code(spec.training, base, home())
    spec, data_note, listing = pinned_shards(absolute_dataset(spec, base), own_disks=typed)
    dataset = dataset_pin(spec)
    # The flavors its nodes run, before the run exists: an environment that cannot be resolved is
    # refused (exit 2) with nothing created. Building configs is cheap; resolving is not.
    probe = build_node_configs(spec, "RUN_ID", StoreConfig(url="file:///RUN_ID"), plan, typed=typed)
    env = Environment.of(spec, probe, install, locks)
    run = Run.create(spec, spec_path, argv)
    store = run.store()
    wheel_pin = None
    if install.wheel is not None:  # nodes install exactly this wheel, from the run's store
        uri = store.wheel_uri(install.wheel.name)
        wheel_pin = WheelPin(name=install.wheel.name, sha256=file_sha256(install.wheel), uri=uri)
    configs = env.locked(build_node_configs(spec, run.id, run.manifest().store, plan, code, typed=typed))
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
    if install.wheel is not None:
        if upload:
            store.put_wheel(install.wheel)
        shutil.copy2(install.wheel, run.dir / "code" / install.wheel.name)
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
        environment=env.pins(store.lock_uri),
        dataset=dataset,
        seeds={"seed": spec.training.seed, "deterministic": spec.training.deterministic},
        **(pins or {}),
    )
    if upload:
        run.publish_manifest()
    field = "training.command" if spec.training.command else "training.entrypoint"
    warnings = tuple(code.warnings(field)) if code else ()
    notes = (data_note,) if data_note else ()
    return Prepared(spec, run, plan, configs, user_data, upload, warnings, notes)


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
    ) -> Environment:
        """`locks` (a rerun's) are taken as they are; else each flavor is resolved now."""
        index = node_index(spec, install)
        if locks is None:
            dlinfra = str(install.wheel) if install.wheel else (install.requirement or "").partition("==")[2]
            flavors = sorted({cfg.flavor for cfg in configs.values()})
            script = spec.training.command is not None
            locks = {
                f: resolve(dlinfra, spec.training.requirements, f, install.platform, index, script)
                for f in flavors
            }
        return cls(locks, index)

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


def absolute_dataset(spec: Spec, base: Path) -> Spec:
    """The spec with relative file:// dataset URIs made absolute against `base` (the experiment
    file's directory), so the pin hashes the very file the nodes read, whatever their working
    directory."""
    ds = spec.training.dataset
    given = {name: uri for name, uri in (("uri", ds.uri), ("eval_uri", ds.eval_uri)) if uri}
    update = {name: _absolute(uri, name, ds.format, base) for name, uri in given.items()}
    return _with_dataset(spec, **update) if update != given else spec


def _absolute(uri: str, field: str, fmt: str, base: Path) -> str:
    if not uri.startswith("file://") or Path(uri[len("file://") :]).is_absolute():
        return uri
    listing = is_listing(uri)
    relative, _, pattern = (
        uri[len("file://") :].rpartition("/") if listing else (uri[len("file://") :], "", "")
    )
    local = (base / relative).resolve()
    staged = fmt in ("tfrecord", "files")
    if not (local.is_dir() if staged else local.is_file()):
        what = (
            "directory of your files"
            if listing
            else "directory `dlinfra data pack` wrote"
            if staged
            else "data file"
        )
        raise SpecError(
            [
                f"training.dataset.{field}: {uri} is relative to the experiment file's directory ({base}), "
                f"and {local} is not a {'directory' if staged else 'file'}. Fix: point it at the "
                f"{what}, relative to {base} or absolute (file:///path/to/data)"
            ]
        )
    return f"file://{local}/{pattern}" if listing else f"file://{local}"


def _with_dataset(spec: Spec, **fields: Any) -> Spec:
    dataset = spec.training.dataset.model_copy(update=fields)
    return spec.model_copy(update={"training": spec.training.model_copy(update={"dataset": dataset})})


def pinned_shards(spec: Spec, own_disks: bool) -> tuple[Spec, str | None, bytes | None]:
    """A TFRecord data set read now, as the nodes will read it: a packed set's manifest, or your own
    files as a glob lists them. It must be there and fit the cluster and its disks, and its sha256
    (which names every shard's, or every file's size and etag) is pinned in the spec, so every node
    and any rerun reads these very files. A spec that pins another sha256 is refused: the data
    changed. Returns the spec, a line saying what the nodes will stage, and where (on `own_disks`
    each node stages on its instance's root volume, aws.root_volume_gb, else all share this
    machine's disk), and a listing's bytes, which the run stores for its nodes."""
    ds = spec.training.dataset
    if not ds.staged or ds.uri is None:
        return spec, None, None
    where = StoreConfig.for_run(spec, ds.uri)
    listing = None
    try:
        if is_listing(ds.uri):
            manifest = listed_manifest(ds, where.endpoint_url, where.region)
            listing = listing_bytes(manifest)
            pinned = staging.Pinned(manifest, listing_sha256(listing))
            if ds.sha256 is not None and ds.sha256 != pinned.sha256:
                raise SpecError(
                    [
                        f"training.dataset.uri: the files {ds.uri} lists changed since the run listed them "
                        f"(sha256 {ds.sha256[:12]}, now {pinned.sha256[:12]}: a file added, removed or "
                        "rewritten). Fix: restore them, or deploy anew to train on them as they are"
                    ]
                )
        else:
            store = Store.from_url(where.url, where.endpoint_url, where.region)
            pinned = staging.read_manifest(store, ds.sha256)
    except SpecError:
        raise
    except DlinfraError as exc:  # the store's own errors (access, a missing bucket) and the pin's
        raise SpecError([str(exc)]) from None
    workers = spec.roles()["worker"].count
    builtin = not (spec.training.entrypoint or spec.training.command)
    if problems := staging.fit_problems(pinned.manifest, workers, ds.model_fields_set, builtin):
        raise SpecError(problems)
    if ds.cache_gb is not None and (problem := streaming.cache_problem(pinned.manifest, ds.cache_gb)):
        raise SpecError([problem])
    cache = None if ds.cache_gb is None else streaming.cache_bytes(ds.cache_gb)
    dispatched = spec.training.dispatches_files(spec.strategy)
    shares = staging.node_shares(pinned.manifest, spec.strategy, workers, cache, dispatched)
    splits = pinned.manifest.splits
    note = (
        f"data: {pinned.manifest.source} ({staging.pin_name(pinned.manifest)} {pinned.sha256[:12]}), "
        f"{len(splits['train'].shards)} train + {len(splits['eval'].shards)} eval shards; "
        + ("workers take train files as they are free (tf.data service on the chief); " if dispatched else "")
    )
    if own_disks:
        disks = {node: node_disk(spec, node) for node in shares}
        problem = staging.room_problem(shares, disks, None)
        node, most = staging.largest(shares)
        note += f"a node stages up to {staging.size(most)} ({node}) on {disks[node].where}"
        if cache is not None:
            note += f", its train files streamed through a {staging.size(cache)} cache"
    else:
        free = shutil.disk_usage(_existing(home())).free
        problem = staging.room_problem(shares, None, (str(home()), free))
        total = sum(share.bytes for share in shares.values())
        note += f"the nodes stage {staging.size(total)} under {home()} ({staging.size(free)} free)"
        if cache is not None:
            note += f", each one's train files streamed through a {staging.size(cache)} cache"
    if problem:
        raise SpecError([problem])
    return _with_dataset(spec, sha256=pinned.sha256), note, listing


def node_disk(spec: Spec, node: str) -> staging.NodeDisk:
    """The disk an instance stages data on: its type's NVMe instance store (the first disk of it),
    else its root volume (see node.instance_store)."""
    role = node.rsplit("-", 1)[0]
    kind = catalog().get(spec.roles()[role].instance_type)
    if kind is None or not kind.instance_store_gb:
        gib = spec.aws.root_volume_gb
        return staging.NodeDisk(gib * staging.GIB, f"its root volume of {gib} GiB", "aws.root_volume_gb")
    disks = kind.instance_store_disks or 1
    first = f"the first of {kind.name}'s {kind.instance_store_text()}s" if disks > 1 else None
    where = first or f"{kind.name}'s {kind.instance_store_text()}"
    field = "cluster.chief.instance_type" if role == "chief" else "cluster.workers.instance_type"
    return staging.NodeDisk(kind.instance_store_gb // disks * 10**9, where, field)


def _existing(path: Path) -> Path:
    """The nearest directory that exists at or above `path` (DLINFRA_HOME may not be made yet)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def dataset_pin(spec: Spec) -> dict[str, Any]:
    """What identifies the training data: built-in sets by their package version, a URI by sha256
    (computed here for a local file the spec did not pin; None when nothing can pin it)."""
    ds = spec.training.dataset
    pin: dict[str, Any] = {"format": ds.format, "uri": ds.uri, "sha256": ds.sha256}
    if ds.format == "digits":
        pin["source"] = f"scikit-learn {package_version('scikit-learn')}"
    elif ds.format == "synthetic":
        pin["source"] = f"generated from training.seed {spec.training.seed}"
    elif ds.staged:
        pin["source"] = "the sha256 of the shard manifest or of the run's listing (it names each file's)"
    elif ds.sha256 is None and ds.uri and ds.uri.startswith("file://"):
        local = Path(ds.uri[len("file://") :])
        if local.is_file():
            pin["sha256"] = file_sha256(local)
    pin["pinned"] = ds.format != "cifar10" or pin["sha256"] is not None
    return pin
