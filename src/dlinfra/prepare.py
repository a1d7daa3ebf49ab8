"""Preparing a run: the run record, its code in the store, and one cloud-init user-data per node.

Everything here is the same for every target; a target only contributes where nodes listen
(the address plan) and what they install.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlinfra.contract import NodeConfig
from dlinfra.errors import SpecError
from dlinfra.render import (
    AddressPlan,
    Install,
    Node,
    build_node_configs,
    node_config_from_user_data,
    render_cluster,
)
from dlinfra.runs.bundle import Bundle, file_sha256, pack_entrypoint
from dlinfra.runs.layout import RunStore, bundle_key
from dlinfra.runs.records import WheelPin
from dlinfra.runs.run import Run, package_version
from dlinfra.spec.model import Spec


@dataclass(frozen=True)
class NodeInstall:
    """What a node installs before it runs the agent: nothing (a local process shares this
    interpreter), a pip requirement, or this run's dlinfra wheel shipped through the store."""

    requirement: str | None = None
    wheel: Path | None = None


@dataclass
class Prepared:
    spec: Spec
    run: Run
    plan: AddressPlan
    configs: dict[str, NodeConfig]
    user_data: dict[str, str]
    upload: bool = True  # False: nothing was (or may be) written to the results store

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
        return cls(run.spec(), run, AddressPlan(tuple(nodes)), configs, user_data)


def prepare(
    spec: Spec,
    plan: AddressPlan,
    install: NodeInstall,
    spec_path: Path | None = None,
    argv: list[str] | None = None,
    code: Bundle | None = None,
    pins: dict[str, Any] | None = None,
    *,
    typed: bool,
    upload: bool = True,
    user_data_limit: int | None = None,
) -> Prepared:
    """Create the run record, store the code bundle, render every node's user-data into the run dir.
    `code` (a rerun's pinned bundle) replaces packing the entrypoint's directory; `pins` are extra
    manifest fields (e.g. `rerun_of`); `typed`: the target runs nodes on their instance types.
    `upload=False` (a plan for review by a read-only role) writes the run dir alone: the user-data
    names the wheel's store URI, but nothing goes to the store. A spec whose user-data would exceed
    `user_data_limit` leaves nothing behind: it is rendered before anything is stored."""
    base = spec_path.absolute().parent if spec_path else Path.cwd()
    if code is None and spec.training.entrypoint:
        code = pack_entrypoint(spec.training.entrypoint, base)
    spec = absolute_dataset(spec, base)
    dataset = dataset_pin(spec)
    run = Run.create(spec, spec_path, argv)
    store = run.store()
    requirement, wheel_pin = install.requirement, None
    if install.wheel is not None:  # cloud nodes install exactly this wheel, from the run's store
        requirement = store.wheel_uri(install.wheel.name)
        wheel_pin = WheelPin(name=install.wheel.name, sha256=file_sha256(install.wheel), uri=requirement)
    configs = build_node_configs(spec, run.id, run.manifest().store, plan, code, typed=typed)
    try:
        user_data = render_cluster(configs, node_install(spec, requirement, wheel_pin), user_data_limit)
    except SpecError:
        shutil.rmtree(run.dir)
        raise
    (run.dir / "code").mkdir()
    if code is not None:
        if upload:
            store.put_bundle(code.sha256, code.data)
        (run.dir / bundle_key(code.sha256)).write_bytes(code.data)
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
        install=requirement,
        dataset=dataset,
        seeds={"seed": spec.training.seed, "deterministic": spec.training.deterministic},
        **(pins or {}),
    )
    if upload:
        run.publish_manifest()
    return Prepared(spec, run, plan, configs, user_data, upload)


def node_install(spec: Spec, requirement: str | None, wheel: WheelPin | None) -> Install | None:
    """What the user-data tells a cloud node to install (nothing for local processes)."""
    if requirement is None:
        return None
    sha256 = wheel.sha256 if wheel else None
    return Install(requirement, sha256, spec.aws.pip_index_url, spec.aws.pip_extra_ca)


def absolute_dataset(spec: Spec, base: Path) -> Spec:
    """The spec with a relative file:// dataset made absolute against `base` (the experiment file's
    directory), so the pin hashes the very file the nodes read, whatever their working directory."""
    uri = spec.training.dataset.uri
    if not uri or not uri.startswith("file://") or Path(uri[len("file://") :]).is_absolute():
        return spec
    local = (base / uri[len("file://") :]).resolve()
    if not local.is_file():
        raise SpecError(
            [
                f"training.dataset.uri: {uri} is relative to the experiment file's directory ({base}), "
                f"and {local} is not a file. Fix: point it at the data file, relative to {base} or "
                "absolute (file:///path/to/data)"
            ]
        )
    dataset = spec.training.dataset.model_copy(update={"uri": f"file://{local}"})
    return spec.model_copy(update={"training": spec.training.model_copy(update={"dataset": dataset})})


def dataset_pin(spec: Spec) -> dict[str, Any]:
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
        if local.is_file():
            pin["sha256"] = file_sha256(local)
    pin["pinned"] = ds.format != "cifar10" or pin["sha256"] is not None
    return pin
