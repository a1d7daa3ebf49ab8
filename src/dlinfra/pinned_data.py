"""A run's data set pinned before it starts: relative file URIs made absolute, a TFRecord set's
manifest or listing read (it must be there and fit the cluster and its disks), and what identifies
the data in the manifest."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dlinfra.contract import StoreConfig
from dlinfra.errors import DlinfraError, SpecError
from dlinfra.runs.bundle import file_sha256
from dlinfra.runs.run import home, package_version
from dlinfra.runs.store import Listed, Store
from dlinfra.runs.store_url import open_store
from dlinfra.spec.catalog import catalog
from dlinfra.spec.dataset import is_listing
from dlinfra.spec.input import shown
from dlinfra.spec.model import Spec
from dlinfra.training import staging, streaming
from dlinfra.training.listing import listed_manifest, listing_bytes, listing_sha256


def absolute_dataset(spec: Spec, base: Path) -> Spec:
    """The spec with relative file:// dataset URIs made absolute against `base` (the experiment
    file's directory), so the pin hashes the very file the nodes read, whatever their working
    directory."""
    ds = spec.training.dataset
    given = {name: uri for name, uri in (("uri", ds.uri), ("eval_uri", ds.eval_uri)) if uri}
    update = {
        name: _absolute(uri, name, ds.format, base, ds.outside_experiment_dir) for name, uri in given.items()
    }
    return _with_dataset(spec, **update) if update != given else spec


def _absolute(uri: str, field: str, fmt: str, base: Path, outside: bool) -> str:
    if not uri.startswith("file://") or Path(uri[len("file://") :]).is_absolute():
        return uri
    listing = is_listing(uri)
    relative, _, pattern = (
        uri[len("file://") :].rpartition("/") if listing else (uri[len("file://") :], "", "")
    )
    local = (base / relative).resolve()
    if not outside and not local.is_relative_to(base.resolve()):
        # a relative path reads as "beside the experiment"; '..' or a link leading out of it is a
        # path the user may not have meant (a shared experiment listing /etc as shards)
        raise SpecError(
            [
                f"training.dataset.{field}: {shown(uri)} leads out of the experiment file's directory "
                f"({base}) to {local}. Fix: keep the data under {base}, give it as an absolute "
                "file:///path, or set training.dataset.outside_experiment_dir: true if you mean it"
            ]
        )
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
    listing, stored = None, None  # a listing's files are known by what it lists
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
            store = open_store(where.url, where.endpoint_url, where.region)
            pinned = staging.read_manifest(store, ds.sha256)
            stored = _stored(store)
    except SpecError:
        raise
    except DlinfraError as exc:  # the store's own errors (access, a missing bucket) and the pin's
        raise SpecError([str(exc)]) from None
    if problems := staging.stored_problems(pinned.manifest, where.url, stored):
        raise SpecError(problems)
    workers = spec.roles()["worker"].count
    if problems := staging.fit_problems(pinned.manifest, workers, ds.model_fields_set):
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


def _stored(store: Store) -> list[Listed] | None:
    """The packed directory's files, to check against its manifest; None when this identity may
    read the shards but not list them (the nodes check each shard's sha256 as it lands)."""
    try:
        return store.files()
    except DlinfraError:
        return None


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
