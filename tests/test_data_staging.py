"""A packed data set read by a run: each node stages its own share of real shards, checked against
the manifest the run pinned, and the built-in program parses them into the source's images."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from dlinfra.contract import NodeConfig
from dlinfra.runs.layout import RunStore
from dlinfra.runs.store_url import open_store
from dlinfra.spec.dataset import DatasetSpec
from dlinfra.spec.training import TrainingSpec
from dlinfra.training import data, node_data, shards, staging
from dlinfra.training.packed import packed_program
from dlinfra.training.program import Shard
from support import pack_digits, staging_node

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, shards.ShardManifest]:
    """digits in 8 train and 2 eval shards of PNGs."""
    root = tmp_path_factory.mktemp("packed")
    return root, pack_digits(root, 8, 2)


def _node(root: Path, role: str, index: int, workers: int = 3, sha256: str | None = None) -> NodeConfig:
    dataset = DatasetSpec(format="tfrecord", uri=f"file://{root}", sha256=sha256)
    return staging_node(
        role, index, TrainingSpec(dataset=dataset), root / "results", f"file://{root}", workers
    )


def _stage(node: NodeConfig, work: Path) -> node_data.Staged | None:
    return node_data.stage_node(node, RunStore.open(node.store), work, lambda: None)


def _ids(paths: list[Path]) -> list[int]:
    return [i for path in paths for i, _, _ in shards.records(path)]


def test_workers_stage_disjoint_shares_that_cover_every_example(
    tmp_path: Path, packed: tuple[Path, shards.ShardManifest]
) -> None:
    root, manifest = packed
    staged: dict[str, list[Path]] = {}
    for role, index in (("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2), ("ps", 0)):
        work = tmp_path / f"{role}-{index}"
        _stage(_node(root, role, index), work)
        staged[f"{role}-{index}"] = sorted((work / staging.TRAIN_DIR).glob("*.tfrecord"))
    assert [len(staged[f"worker-{i}"]) for i in range(3)] == [3, 3, 2], "8 shards dealt round-robin"
    worker_ids = [_ids(staged[f"worker-{i}"]) for i in range(3)]
    every = sorted(i for ids in worker_ids for i in ids)
    assert every == sorted(_ids([root / s.name for s in manifest.splits["train"].shards]))
    assert len(every) == len(set(every)) == manifest.splits["train"].records, "each example once"
    assert [p.name for p in staged["chief-0"]] == [manifest.splits["train"].shards[0].name]
    assert not (tmp_path / "ps-0").exists(), "a ps stages nothing"
    # the chief evaluates: it alone holds the eval shards
    assert len(list((tmp_path / "chief-0" / staging.EVAL_DIR).glob("*.tfrecord"))) == 2
    assert not list((tmp_path / "worker-0" / staging.EVAL_DIR).glob("*"))


def test_a_restart_keeps_checked_files_and_a_corrupt_shard_is_refused(
    tmp_path: Path, packed: tuple[Path, shards.ShardManifest]
) -> None:
    root, manifest = packed
    work = tmp_path / "worker-1"
    node = _node(root, "worker", 1)
    _stage(node, work)
    kept = work / staging.TRAIN_DIR / manifest.splits["train"].shards[1].name
    inode = kept.stat().st_ino
    (work / staging.TRAIN_DIR / "train-99999-of-99999.tfrecord").write_bytes(b"an earlier run's")
    _stage(node, work)
    assert kept.stat().st_ino == inode, "a file whose checksum matches is not fetched again"
    assert not (work / staging.TRAIN_DIR / "train-99999-of-99999.tfrecord").exists(), "stale shard removed"

    kept.write_bytes(kept.read_bytes()[:-1] + b"\x00")  # damaged on local disk: fetched again
    _stage(node, work)
    assert kept.stat().st_ino != inode

    # damaged in the store: refused by its checksum, nothing half-written left to read
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in root.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    (copy / kept.name).write_bytes(b"not the packed shard")
    with pytest.raises(staging.DataError, match=f"{kept.name} has sha256 .* its manifest says"):
        _stage(_node(copy, "worker", 1), tmp_path / "other")
    left = {p.name for p in (tmp_path / "other" / staging.TRAIN_DIR).iterdir()}
    assert kept.name not in left and f".{kept.name}.part" not in left


def test_the_pin_refuses_a_changed_manifest(
    tmp_path: Path, packed: tuple[Path, shards.ShardManifest]
) -> None:
    root, _ = packed
    store = open_store(f"file://{root}")
    pin = staging.read_manifest(store, None).sha256
    assert staging.read_manifest(store, pin).sha256 == pin
    with pytest.raises(staging.DataError, match="changed since the run pinned them"):
        _stage(_node(root, "worker", 0, sha256="0" * 64), tmp_path)
    with pytest.raises(staging.DataError, match=r"no manifest\.json at"):
        staging.read_manifest(open_store(f"file://{tmp_path}"), None)


def test_fit_problems_name_the_field_and_the_fix(packed: tuple[Path, shards.ShardManifest]) -> None:
    _, manifest = packed
    assert staging.fit_problems(manifest, 8, set()) == []
    (few,) = staging.fit_problems(manifest, 9, set())
    assert "8 train shards for 9 workers" in few and "--shards 9" in few
    mixed = manifest.model_copy(update={"shape": None})
    (shape,) = staging.fit_problems(mixed, 2, set())
    assert shape.startswith("training.dataset.shape:")
    assert staging.fit_problems(mixed, 2, {"shape"}) == []


def test_the_built_in_program_reads_the_source_pixels_from_staged_shards(
    tmp_path: Path, packed: tuple[Path, shards.ShardManifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, manifest = packed
    _stage(_node(root, "chief", 0), tmp_path)
    monkeypatch.chdir(tmp_path)  # what the agent does: staged paths are relative to the work dir
    program = packed_program(
        TrainingSpec(dataset=DatasetSpec(format="tfrecord", uri=f"file://{root}")), manifest
    )
    arrays = data.load(data.DatasetSpec(), Path("/nonexistent"))
    images, labels = next(iter(program.eval_data().batch(1000)))
    assert images.shape[1:] == (8, 8, 1) and images.dtype == tf.float32
    assert len(labels) == manifest.splits["eval"].records
    # the same multiset of pixels as the source's held-out split (PNG is lossless; 8-bit rounding)
    source = np.clip(np.rint(arrays.x_test * 255), 0, 255).astype("uint8")
    assert sorted(map(bytes, np.rint(images.numpy() * 255).astype("uint8"))) == sorted(map(bytes, source))
    assert sorted(labels.numpy().tolist()) == sorted(arrays.y_test.tolist())
    first = next(iter(program.train_data(Shard(0, 1, staging.TRAIN_PATTERN)).batch(4)))
    assert first[0].shape == (4, 8, 8, 1)
    model = program.build_model()
    assert model.output_shape == (None, len(manifest.classes))
    assert json.loads((root / "manifest.json").read_text())["shape"] == [8, 8, 1]


def test_every_node_share_and_the_room_it_needs(packed: tuple[Path, shards.ShardManifest]) -> None:
    """What each node stages, as deploy reckons it before anything is provisioned: a share it would
    not fit on its disk is refused, naming the field and the size that fits."""
    _, manifest = packed
    train, held = manifest.splits["train"].shards, manifest.splits["eval"].shards
    ps = staging.node_shares(manifest, "parameter_server", 3)
    assert ps["chief-0"].train == train[:1] and ps["chief-0"].eval == held
    assert sorted(s.name for w in range(3) for s in ps[f"worker-{w}"].train) == sorted(s.name for s in train)
    mirrored = staging.node_shares(manifest, "multi_worker_mirrored", 2)
    assert set(mirrored) == {"worker-0", "worker-1"} and mirrored["worker-0"].eval == held
    assert mirrored["worker-0"].train == train[0::2] and mirrored["worker-1"].eval == []

    # the same shards, each 40 GiB: a node's share against its root volume, all of them against one disk
    big = {
        split: part.model_copy(
            update={"shards": [s.model_copy(update={"bytes": 40 * staging.GIB}) for s in part.shards]}
        )
        for split, part in manifest.splits.items()
    }
    huge = staging.node_shares(manifest.model_copy(update={"splits": big}), "multi_worker_mirrored", 2)
    assert huge["worker-0"].bytes == (4 + 2) * 40 * staging.GIB  # 4 train shards and the 2 eval ones

    def root(gib: int) -> dict[str, staging.NodeDisk]:
        return {
            n: staging.NodeDisk(gib * staging.GIB, f"its root volume of {gib} GiB", "aws.root_volume_gb")
            for n in huge
        }

    refused = staging.room_problem(huge, root(200), None)
    assert refused is not None and refused.startswith(
        "aws.root_volume_gb: worker-0 stages 240.0 GiB of shards on its root volume of 200 GiB. "
        "Fix: raise it above 240 GiB"
    )
    assert staging.room_problem(huge, root(250), None) is None
    store = staging.NodeDisk(
        250 * 10**9, "g5.xlarge's 250 GB NVMe instance store", "cluster.workers.instance_type"
    )
    refused = staging.room_problem(huge, root(250) | {"worker-0": store}, None)
    assert refused is not None and refused.startswith(
        "cluster.workers.instance_type: worker-0 stages 240.0 GiB of shards on g5.xlarge's 250 GB NVMe "
        "instance store. Fix: choose a type whose instance store holds 240 GiB"
    )
    local = staging.room_problem(huge, None, ("/home/me/.dlinfra", 100 * staging.GIB))
    assert local is not None and local.startswith("training.dataset.uri: the nodes stage 400.0 GiB")
    assert "100.0 GiB free" in local and staging.room_problem(huge, None, ("/x", 401 * staging.GIB)) is None


def test_deploy_says_what_the_nodes_stage_and_where_and_refuses_a_volume_too_small(
    tmp_path: Path, packed: tuple[Path, shards.ShardManifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlinfra.errors import SpecError
    from dlinfra.pinned_data import pinned_shards
    from dlinfra.spec.model import Spec

    root, _ = packed
    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "home"))

    def spec(target: str, uri: str, **cluster: object) -> Spec:
        dataset = {"format": "tfrecord", "uri": uri}
        return Spec.model_validate(
            {"name": "x", "target": target, "training": {"dataset": dataset}, **cluster}
        )

    g5 = {"cluster": {"workers": {"count": 2, "instance_type": "g5.xlarge"}}}
    pinned, note, listing = pinned_shards(spec("aws", f"file://{root}", **g5), own_disks=True)
    assert pinned.training.dataset.sha256 is not None and note is not None and listing is None
    assert note.startswith("data: digits (manifest ") and "8 train + 2 eval shards" in note
    assert re.search(
        r"a node stages up to [\d.]+ [KM]iB \(worker-\d\) on g5.xlarge's 250 GB NVMe instance store$", note
    )
    _, local, _ = pinned_shards(spec("local", f"file://{root}"), own_disks=False)
    assert local is not None and f"under {tmp_path / 'home'} (" in local and "GiB free)" in local

    # the same manifest, its shards 60 GiB each: 4 train shards a worker (parameter servers: the chief
    # takes the eval ones) on a 100 GiB root volume
    big = json.loads((root / "manifest.json").read_text())
    for split in big["splits"].values():
        for shard in split["shards"]:
            shard["bytes"] = 60 * staging.GIB
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "manifest.json").write_text(json.dumps(big))
    for split in big["splits"].values():  # sparse: the plan compares the listed sizes to the manifest's
        for shard in split["shards"]:
            with (tmp_path / "big" / shard["name"]).open("wb") as fh:
                fh.truncate(shard["bytes"])
    with pytest.raises(SpecError) as refused:
        pinned_shards(spec("aws", f"file://{tmp_path / 'big'}", **g5), own_disks=True)
    # the chief (m5.xlarge: EBS only) stages one train shard and the two eval ones on its root volume
    assert "aws.root_volume_gb: chief-0 stages 180.0 GiB of shards on its root volume of 100 GiB" in str(
        refused.value
    )
    roomy = {"cluster": {"chief": {"instance_type": "g5.8xlarge"}, **g5["cluster"]}}
    with pytest.raises(SpecError) as refused:
        pinned_shards(spec("aws", f"file://{tmp_path / 'big'}", **roomy), own_disks=True)
    # parameter servers: any train file may come to any worker, so each counts the whole set (8 x 60
    # GiB), and more workers would not help: the cache does
    assert str(refused.value) == (
        "cluster.workers.instance_type: worker-0 stages 480.0 GiB of shards on g5.xlarge's 250 GB NVMe "
        "instance store. Fix: choose a type whose instance store holds 480 GiB, set "
        "training.dataset.cache_gb (the train files stream through a cache of that size)"
    )
    mirrored = spec("aws", f"file://{tmp_path / 'big'}", strategy="multi_worker_mirrored", **roomy)
    with pytest.raises(SpecError) as refused:
        pinned_shards(mirrored, own_disks=True)
    # mirrored: worker-0 stages its 4 train shards and the 2 eval ones (it evaluates)
    assert "worker-0 stages 360.0 GiB of shards on g5.xlarge's 250 GB NVMe instance store" in str(
        refused.value
    )
    assert str(refused.value).endswith("or deploy more workers (each stages its share of the train shards)")
