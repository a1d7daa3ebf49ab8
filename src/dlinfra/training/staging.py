"""A packed data set's shards brought to the node that reads them (`training.dataset.format:
tfrecord`).

TensorFlow 2.21 reads no s3:// path, so the node agent moves the bytes and TensorFlow reads local
files. Each node stages only its own share, into the same path relative to its work directory (the
trainer's working directory): under parameter servers one dataset function is traced on the chief
and runs on every worker, and a relative path then reads each worker's own files (see
../shared/reference/data-at-scale.md, fact 3). Shards are dealt round-robin: shard i goes to input
pipeline i % pipelines, so no two pipelines read the same record and, with no fault, each reads its
files whole once per epoch.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dlinfra.contract import NodeConfig
from dlinfra.errors import DlinfraError
from dlinfra.runs.bundle import file_sha256
from dlinfra.runs.layout import DATA_MANIFEST, RunStore
from dlinfra.runs.store import Listed, Store
from dlinfra.runs.store_url import open_store
from dlinfra.spec.dataset import is_listing
from dlinfra.training.shards import ShardFile, ShardManifest

# Relative to the trainer's working directory (its work dir): the same string on every node.
SHARDS_DIR = Path("shards")  # on an instance with an instance store, that disk (node.instance_store)
TRAIN_DIR = SHARDS_DIR / "train"
EVAL_DIR = SHARDS_DIR / "eval"
TRAIN_PATTERN = f"{TRAIN_DIR}/*.tfrecord"
EVAL_PATTERN = f"{EVAL_DIR}/*.tfrecord"
# format files: your own files keep their names (staging ends before training starts, and removes
# what a killed fetch left, so the directory then holds nothing else)
FILES_PATTERNS = (f"{TRAIN_DIR}/*", f"{EVAL_DIR}/*")
PARALLEL_OBJECTS = 8  # objects in flight at once; each big one is also split into ranged parts
GIB = 2**30


class DataError(DlinfraError):
    """The packed data cannot be read as the run pinned it; the message says what to do."""


@dataclass(frozen=True)
class Pinned:
    manifest: ShardManifest
    sha256: str  # of the manifest's bytes: it names every shard's sha256, so it pins them all


def read_manifest(store: Store, pinned: str | None) -> Pinned:
    """The packed set's manifest, checked against the run's pin (a rerun refuses changed shards)."""
    data = store.get_bytes(DATA_MANIFEST)
    if data is None:
        raise DataError(
            f"training.dataset.uri: no {DATA_MANIFEST} at {store.uri()}. "
            "Fix: point it at a directory `dlinfra data pack` wrote"
        )
    sha256 = hashlib.sha256(data).hexdigest()
    if pinned is not None and sha256 != pinned:
        raise DataError(
            f"training.dataset.uri: the shards at {store.uri()} changed since the run pinned them "
            f"(its manifest's sha256 is {sha256[:12]}, training.dataset.sha256 is {pinned[:12]}). "
            "Fix: restore the packed set, or deploy anew to train on the new one"
        )
    try:
        return Pinned(ShardManifest.model_validate(json.loads(data)), sha256)
    except ValueError as exc:
        where = store.uri(DATA_MANIFEST)
        raise DataError(f"training.dataset.uri: {where} is not a data manifest: {exc}") from None


def fit_problems(manifest: ShardManifest, workers: int, given: set[str]) -> list[str]:
    """What keeps a data set from training on `workers` workers, each with its fix (checked when the
    run is prepared, before anything is provisioned). `given`: the training.dataset fields the spec
    sets. What the built-in model needs that the spec alone shows, the spec refuses itself
    (DatasetSpec.builtin_problem)."""
    problems = []
    listed = manifest.locations is not None
    shards = len(manifest.splits["train"].shards)
    if shards < workers:
        more = "split your files into more" if listed else f"pack again with --shards {workers} or more"
        problems.append(
            f"training.dataset.uri: {shards} train shards for {workers} workers, and each worker reads "
            f"whole shards of its own. Fix: {more} (10 per worker keeps them even), or deploy fewer workers"
        )
    if not listed and not manifest.splits["eval"].shards:
        problems.append(
            "training.dataset.uri: the set has no eval shards. Fix: pack again with --eval-shards 1"
        )
    if manifest.shape is None and "shape" not in given:
        problems.append(
            "training.dataset.shape: the packed images differ in size (packed as they were). Fix: set "
            "the shape every image is resized to, e.g. shape: [64, 64, 3]"
        )
    return problems


def stored_problems(manifest: ShardManifest, where: str, stored: list[Listed] | None) -> list[str]:
    """What a node would find only once the cluster is up, known now from the manifest and a listing
    of the store (`stored`, None when the planner may not list it): empty files, and a packed set's
    shards missing or of another size than its manifest says (their sha256 is checked as they land)."""
    problems = []
    listed = manifest.locations is not None
    sizes = {f.name: f.bytes for f in stored or []}
    for split, files in ((split, manifest.splits[split].shards) for split in ("train", "eval")):
        location = manifest.locations[split] if manifest.locations else where
        field = "eval_uri" if listed and split == "eval" else "uri"
        fix = "Fix: pack the set again (`dlinfra data pack`)" if not listed else ""
        for shard in files:
            name = f"{location}/{shard.name}"
            if shard.bytes == 0 or shard.records == 0:
                fix = fix or "Fix: remove it, or narrow the glob so that it does not match it"
                problems.append(f"training.dataset.{field}: {name} is empty: nothing to read. {fix}")
            elif stored is not None and not listed and shard.name not in sizes:
                problems.append(f"training.dataset.uri: {name} is missing, and its manifest names it. {fix}")
            elif stored is not None and not listed and sizes[shard.name] != shard.bytes:
                problems.append(
                    f"training.dataset.uri: {name} has {sizes[shard.name]} bytes, its manifest says "
                    f"{shard.bytes}: it changed since it was packed. {fix}"
                )
    return problems


def pin_name(manifest: ShardManifest) -> str:
    return "listing" if manifest.locations is not None else "manifest"


def share(shards: list[ShardFile], pipeline: int, count: int) -> list[ShardFile]:
    """The shards input pipeline `pipeline` of `count` reads."""
    return shards[pipeline::count]


@dataclass(frozen=True)
class NodeShare:
    train: list[ShardFile]
    eval: list[ShardFile]
    cache: int | None = None  # the train files stream through this many bytes (dataset.cache_gb)
    every_file: bool = False  # a dispatched worker: any train file may come to it

    @property
    def bytes(self) -> int:
        """The most its node holds on disk at once."""
        train = sum(s.bytes for s in self.train)
        return sum(s.bytes for s in self.eval) + (train if self.cache is None else min(train, self.cache))


def node_shares(
    manifest: ShardManifest, strategy: str, workers: int, cache: int | None = None, dispatched: bool = False
) -> dict[str, NodeShare]:
    """What each node stages, by node name (a ps stages nothing): one input pipeline per worker,
    and the eval shards where the run evaluates. The parameter-server chief trains nothing, but checks
    the first batch and traces the workers' pipeline on its own copy of the first shard. `dispatched`:
    each worker may read any train file (TrainingSpec.dispatches_files), streamed as it takes them."""
    train, held = manifest.splits["train"].shards, manifest.splits["eval"].shards
    shares = {
        f"worker-{w}": NodeShare(train if dispatched else share(train, w, workers), [], cache, dispatched)
        for w in range(workers)
    }
    if strategy == "parameter_server":
        shares["chief-0"] = NodeShare(train[:1], held, cache)
    else:  # worker 0 is the mirrored chief
        shares["worker-0"] = NodeShare(shares["worker-0"].train, held, cache)
    return shares


def size(n: int) -> str:
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def largest(shares: dict[str, NodeShare]) -> tuple[str, int]:
    """The node that stages the most, and its bytes."""
    return max(((name, share.bytes) for name, share in shares.items()), key=lambda pair: pair[1])


@dataclass(frozen=True)
class NodeDisk:
    """Where an instance stages its share: `bytes` of room, `where` for the plan, and the `field`
    that changes it."""

    bytes: int
    where: str  # "its root volume of 100 GiB", "g5.xlarge's 250 GB NVMe instance store"
    field: str  # aws.root_volume_gb, cluster.workers.instance_type


def room_problem(
    shares: dict[str, NodeShare], disks: dict[str, NodeDisk] | None, free: tuple[str, int] | None
) -> str | None:
    """What keeps the staged shards off the disk they go to: each instance's own `disks` (aws), or
    one disk for every node, `free` = (where, bytes free) (local processes)."""
    for node, share in sorted(shares.items()):
        if disks is None:
            break
        disk = disks[node]
        if share.bytes <= disk.bytes:
            continue
        need = math.ceil(share.bytes / GIB)
        fix = (
            f"raise it above {need} GiB plus what the image itself takes"
            if disk.field == "aws.root_volume_gb"
            else f"choose a type whose instance store holds {need} GiB"
        )
        more = (
            "" if share.every_file else ", or deploy more workers (each stages its share of the train shards)"
        )
        return (
            f"{disk.field}: {node} stages {share.bytes / GIB:.1f} GiB of shards on {disk.where}. Fix: "
            f"{fix}, set training.dataset.cache_gb (the train files stream through a cache of that "
            f"size){more}"
        )
    if free is not None:
        where, room = free
        if (total := sum(s.bytes for s in shares.values())) > room:
            return (
                f"training.dataset.uri: the nodes stage {total / GIB:.1f} GiB of shards under {where}, "
                f"which has {room / GIB:.1f} GiB free. Fix: free space there, point DLINFRA_HOME at "
                "a bigger disk, or set training.dataset.cache_gb (each node's train files stream "
                "through a cache of that size)"
            )
    return None


def patterns(fmt: str) -> tuple[str, str]:
    """The staged train and eval files, relative to the node's work directory."""
    return FILES_PATTERNS if fmt == "files" else (TRAIN_PATTERN, EVAL_PATTERN)


def local_name(shard: ShardFile, fmt: str) -> str:
    """Your own TFRecords may be named `train-00001-of-01024`: staged under a name the patterns
    match. Files of any other format keep their names."""
    if fmt == "files" or shard.name.endswith(".tfrecord"):
        return shard.name
    return f"{shard.name}.tfrecord"


def _mismatch(path: Path, shard: ShardFile) -> str | None:
    """How a fetched file differs from what the run pinned: a packed shard's sha256, or (your own
    file, pinned by the run's listing) its size."""
    if shard.sha256 is not None:
        got = file_sha256(path)
        return (
            None if got == shard.sha256 else f"has sha256 {got[:12]}, its manifest says {shard.sha256[:12]}"
        )
    size = path.stat().st_size
    return None if size == shard.bytes else f"has {size} bytes, {shard.bytes} when the run listed it"


def _unreadable(path: Path, compression: str) -> str | None:
    """A TFRecord file of your own read through once, every record's CRC checked by TensorFlow: a
    corrupt file is named as it lands, not met mid-epoch as a DataLossError that names no file."""
    import tensorflow as tf

    # The record reader itself, not tf.data: a dataset would start TensorFlow's eager context, and a
    # node stages before its strategy exists, which must configure collectives or a server first
    # ("Collective ops must be configured at program startup").
    try:
        for _ in tf.compat.v1.io.tf_record_iterator(str(path), compression):
            pass
    except tf.errors.OpError as exc:
        reason = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:.*", "", exc.message.splitlines()[0])[:200]
        return f"is no readable TFRecord file ({reason})"
    return None


def fetch(store: Store, shard: ShardFile, into: Path, fmt: str, records: str | None = None) -> Path:
    """One shard at `into`, checked against the run's pin; kept when an earlier life of the node
    left it there whole. `records`: a file of your own is also read through, with this compression
    (a packed shard's sha256 says it is the one `data pack` wrote)."""
    path = into / local_name(shard, fmt)
    # files land by rename, so a staged one is whole
    if path.is_file() and path.stat().st_size == shard.bytes and _mismatch(path, shard) is None:
        return path
    fix = (
        "Fix: pack the set again (`dlinfra data pack`)"
        if shard.sha256
        else "Fix: restore it, or deploy anew to list the files as they are now"
    )
    partial = path.with_name(f".{path.name}.part")
    if not store.get_file(shard.name, partial):
        raise DataError(f"training.dataset.uri: {shard.name} is missing from {store.uri()}. {fix}")
    if problem := _mismatch(partial, shard):
        partial.unlink()
        raise DataError(f"training.dataset.uri: {shard.name} {problem}. {fix}")
    if records is not None and shard.sha256 is None and (problem := _unreadable(partial, records)):
        partial.unlink()
        raise DataError(
            f"training.dataset.uri: {shard.name} {problem}. Fix: write it again, or move it out of the "
            "glob's directory, and deploy anew"
        )
    partial.replace(path)
    return path


def stage(
    store: Store, shards: list[ShardFile], into: Path, fmt: str = "tfrecord", records: str | None = None
) -> list[Path]:
    """Each shard at `into` (see fetch), several at a time."""
    into.mkdir(parents=True, exist_ok=True)
    wanted = {local_name(s, fmt) for s in shards}
    # another run's, a share that changed with the cluster, or a fetch a kill cut short
    for stale in into.iterdir():
        if stale.is_file() and stale.name not in wanted:
            stale.unlink()
    with ThreadPoolExecutor(max_workers=PARALLEL_OBJECTS) as pool:
        return list(pool.map(lambda shard: fetch(store, shard, into, fmt, records), shards))


def node_set(cfg: NodeConfig, run: RunStore) -> Pinned:
    """The data set this run pinned: your own files as the run listed them (stored with the run), or
    a packed set's manifest, read from beside its shards and checked against the pin."""
    assert cfg.data is not None
    sha256 = cfg.training.dataset.sha256
    if is_listing(cfg.training.dataset.uri):
        assert sha256 is not None  # prepare pins every listing
        return Pinned(ShardManifest.model_validate_json(run.data_listing(sha256)), sha256)
    return read_manifest(open_store(cfg.data.url, cfg.data.endpoint_url, cfg.data.region), sha256)


def split_store(cfg: NodeConfig, manifest: ShardManifest, split: str) -> Store:
    assert cfg.data is not None
    where = manifest.locations[split] if manifest.locations else cfg.data.url
    return open_store(where, cfg.data.endpoint_url, cfg.data.region)


def checked_records(cfg: NodeConfig) -> str | None:
    """The compression to read your own TFRecord files through with as they land (see fetch); None
    where no TensorFlow of ours runs (a script's own, `training.command`) or the files are no TFRecords."""
    ds = cfg.training.dataset
    if ds.format != "tfrecord" or cfg.training.command:
        return None
    # Loaded here, in the one thread that stages: TensorFlow imported by several fetching threads at
    # once gave one of them a half-made module ("module 'tensorflow' has no attribute 'errors'").
    import tensorflow  # noqa: F401

    return ds.compression_type


def stages(cfg: NodeConfig) -> bool:
    """Whether this node copies data files to its disk (a ps never does)."""
    return cfg.training.dataset.staged and cfg.data is not None and cfg.role != "ps"
