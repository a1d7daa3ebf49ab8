"""Your own TFRecord files, named by a glob (`training.dataset.uri: s3://data/imagenet/train-*`), not
packed by dlinfra (tests/own_files.py writes them with plain TensorFlow): listed in a local directory
and in moto's S3, pinned, staged per node from the run's listing, parsed by the built-in model's
parser by their own keys."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from pydantic import ValidationError

from dlinfra.contract import NodeConfig
from dlinfra.errors import SpecError
from dlinfra.pinned_data import pinned_shards
from dlinfra.runs.layout import RunStore
from dlinfra.runs.store_url import open_store
from dlinfra.spec.model import Spec
from dlinfra.targets.aws.tfvars import read_objects
from dlinfra.training import data, node_data, staging
from dlinfra.training.listing import listing_sha256
from dlinfra.training.loop import input_shard
from dlinfra.training.packed import packed_program
from dlinfra.training.program import Shard
from dlinfra.training.shards import ShardManifest
from own_files import OWN_KEYS, write_own_digits
from support import FAKE_CREDS, s3_client, staging_node

pytestmark = pytest.mark.slow
TRAIN_FILES = 8


@pytest.fixture(scope="module")
def own_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_own_digits(tmp_path_factory.mktemp("own"), TRAIN_FILES)


def _spec(uri: str, eval_uri: str | None, workers: int = 3, **dataset: object) -> Spec:
    ds = {"format": "tfrecord", "uri": uri, "features": OWN_KEYS, "shape": [8, 8, 1], "classes": 10}
    if eval_uri:
        ds["eval_uri"] = eval_uri
    return Spec.model_validate(
        {"name": "own", "cluster": {"workers": {"count": workers}}, "training": {"dataset": ds | dataset}}
    )


def _node(spec: Spec, role: str, index: int, results: Path) -> NodeConfig:
    return staging_node(role, index, spec.training, results, spec.training.dataset.uri or "")


def test_a_glob_lists_your_files_and_each_node_stages_its_share_from_the_runs_listing(
    tmp_path: Path, own_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "home"))
    given = _spec(f"file://{own_files}/train/train-*", f"file://{own_files}/validation/validation-*")
    spec, note, listing = pinned_shards(given, own_disks=False)
    assert listing is not None and note is not None
    sha256 = spec.training.dataset.sha256
    assert sha256 == listing_sha256(listing)
    assert note.startswith(
        f"data: file://{own_files}/train/train-* (listing {sha256[:12]}), 8 train + 2 eval"
    )
    manifest = ShardManifest.model_validate_json(listing)
    assert [s.name for s in manifest.splits["train"].shards] == [
        f"train-{f:05d}-of-00008" for f in range(TRAIN_FILES)
    ], "README.txt is not matched"
    assert all(s.sha256 is None and s.etag and s.bytes > 0 for s in manifest.splits["train"].shards)

    results = tmp_path / "results"
    RunStore(open_store(f"file://{results}")).put_data_listing(sha256, listing)
    staged = {}
    for role, index in (("worker", 0), ("worker", 1), ("worker", 2), ("chief", 0)):
        work = tmp_path / f"{role}-{index}"
        cfg = _node(spec, role, index, results)
        node_data.stage_node(cfg, RunStore.open(cfg.store), work, lambda: None)
        staged[f"{role}-{index}"] = sorted(p.name for p in (work / staging.TRAIN_DIR).iterdir())
    assert staged["worker-1"] == ["train-00001-of-00008.tfrecord", "train-00004-of-00008.tfrecord",
                                  "train-00007-of-00008.tfrecord"]  # fmt: skip
    every = sorted(name for w in range(3) for name in staged[f"worker-{w}"])
    assert every == sorted(f"train-{f:05d}-of-00008.tfrecord" for f in range(TRAIN_FILES))
    held = sorted(p.name for p in (tmp_path / "chief-0" / staging.EVAL_DIR).iterdir())
    assert held == ["validation-00000-of-00002.tfrecord", "validation-00001-of-00002.tfrecord"]

    # the built-in model's parser, by your keys: every held-out digit, its label, its pixels (JPEG: near)
    monkeypatch.chdir(tmp_path / "chief-0")
    program = packed_program(spec.training, manifest)
    images, labels = next(iter(program.eval_data().batch(10_000)))
    arrays = data.load(data.DatasetSpec(), Path("/nonexistent"))
    assert images.shape[1:] == (8, 8, 1) and sorted(labels.numpy().tolist()) == sorted(arrays.y_test.tolist())
    assert abs(float(images.numpy().mean()) - float(arrays.x_test.mean())) < 0.01
    first = next(iter(program.train_data(Shard(0, 1, staging.TRAIN_PATTERN)).batch(4)))
    assert first[0].shape == (4, 8, 8, 1)


def test_the_listing_pin_refuses_files_changed_added_or_cut_short(
    tmp_path: Path, own_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "home"))
    copy = tmp_path / "copy"
    for path in (own_files / "train").iterdir():
        (copy / "train").mkdir(parents=True, exist_ok=True)
        (copy / "train" / path.name).write_bytes(path.read_bytes())
    uri = f"file://{copy}/train/train-*"
    # a program of the user's parses and evaluates on its own: no eval_uri, shape or classes needed
    dataset = {"format": "tfrecord", "uri": uri}
    first = Spec.model_validate({"training": {"entrypoint": "train.py:program", "dataset": dataset}})
    spec, _, listing = pinned_shards(first, own_disks=False)
    assert listing is not None
    assert pinned_shards(spec, own_disks=False)[2] == listing, "the same files list the same"

    extra = copy / "train" / f"train-00008-of-{TRAIN_FILES:05d}"
    extra.write_bytes(b"")
    with pytest.raises(SpecError, match="changed since the run listed them"):
        pinned_shards(spec, own_disks=False)
    extra.unlink()
    # a file rewritten after the run listed it: its node refuses it by size, leaving nothing half-read
    results = tmp_path / "results"
    sha256 = spec.training.dataset.sha256
    assert sha256 is not None
    RunStore(open_store(f"file://{results}")).put_data_listing(sha256, listing)
    cut = copy / "train" / "train-00001-of-00008"
    cut.write_bytes(cut.read_bytes()[:100])
    cfg = _node(spec, "worker", 1, results)
    with pytest.raises(
        staging.DataError, match=r"train-00001-of-00008 has 100 bytes, \d+ when the run listed it"
    ):
        node_data.stage_node(cfg, RunStore.open(cfg.store), tmp_path / "w1", lambda: None)
    assert not any(p.name.endswith(".part") for p in (tmp_path / "w1" / staging.TRAIN_DIR).iterdir())


def test_a_corrupt_record_is_named_by_its_file_as_it_lands(
    tmp_path: Path, own_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 55, class 7: a record whose bytes changed (the size the listing pins kept) failed the
    reader mid-epoch with TensorFlow's "corrupted record at N", which names no file."""
    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "home"))
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in (own_files / "train").iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    held = f"file://{own_files}/validation/validation-*"
    spec, _, listing = pinned_shards(_spec(f"file://{copy}/train-*", held), own_disks=False)
    sha256 = spec.training.dataset.sha256
    assert listing is not None and sha256 is not None
    results = tmp_path / "results"
    RunStore(open_store(f"file://{results}")).put_data_listing(sha256, listing)
    damaged = copy / "train-00004-of-00008"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    cfg = _node(spec, "worker", 1, results)
    with pytest.raises(staging.DataError) as refused:
        node_data.stage_node(cfg, RunStore.open(cfg.store), tmp_path / "w1", lambda: None)
    message = str(refused.value)
    assert message.startswith("training.dataset.uri: train-00004-of-00008 is no readable TFRecord file (")
    assert "corrupted record at" in message and "Fix:" in message and "\n" not in message, message
    left = {p.name for p in (tmp_path / "w1" / staging.TRAIN_DIR).iterdir()}
    assert not any("00004" in name for name in left), "nothing of it left to read"


def test_what_the_built_in_model_needs_of_your_files_is_asked_for_before_anything_runs(
    tmp_path: Path, own_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "home"))
    train = f"file://{own_files}/train/train-*"
    # the spec alone shows it: validate refuses it as deploy does (issue 55, class 9)
    with pytest.raises(ValidationError) as asked:
        Spec.model_validate({"training": {"dataset": {"format": "tfrecord", "uri": train}}})
    problems = str(asked.value)
    assert "the built-in model reads your own TFRecord files with training.dataset.eval_uri (" in problems
    assert "shape (your images' shape, e.g. [224, 224, 3])" in problems and "classes (" in problems
    with pytest.raises(SpecError, match=r"8 train shards for 9 workers.*split your files into more"):
        pinned_shards(_spec(train, f"file://{own_files}/validation/*", workers=9), own_disks=False)
    with pytest.raises(SpecError, match=r"training.dataset.eval_uri: no file under .* matches 'val-\*'"):
        pinned_shards(_spec(train, f"file://{own_files}/validation/val-*"), own_disks=False)


def test_raw_pixels_parse_by_the_shape_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pixels = np.arange(2 * 4 * 4 * 3, dtype="uint8").reshape(2, 4, 4, 3)
    (tmp_path / "shards" / "eval").mkdir(parents=True)
    with tf.io.TFRecordWriter(str(tmp_path / "shards" / "eval" / "raw.tfrecord")) as writer:
        for i, image in enumerate(pixels):
            feature = {
                "px": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    features = {"image": "px", "label": "y", "encoding": "raw"}
    spec = _spec("file:///x/raw-*", "file:///x/raw-*", features=features, shape=[4, 4, 3], classes=2)
    manifest = ShardManifest(
        source="x", encoding="raw", shape=[4, 4, 3], classes=["0", "1"], splits={}, created=0.0, locations={}
    )
    monkeypatch.chdir(tmp_path)
    images, labels = next(iter(packed_program(spec.training, manifest).eval_data().batch(2)))
    assert labels.numpy().tolist() == [0, 1]
    assert np.array_equal(np.rint(images.numpy() * 255).astype("uint8"), pixels)


def test_gzip_files_with_one_based_labels_read_by_their_compression_and_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ImageNet's TFRecords are often kept: GZIP-compressed, labels 1 to 1000. The train share a
    node's Shard reads, and the eval files, both decompressed; the labels from 0."""
    pixels = np.arange(3 * 4 * 4 * 3, dtype="uint8").reshape(3, 4, 4, 3)
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    for split in ("train", "eval"):
        (tmp_path / "shards" / split).mkdir(parents=True)
        path = tmp_path / "shards" / split / f"{split}-0.tfrecord"
        with tf.io.TFRecordWriter(str(path), options) as writer:
            for i, image in enumerate(pixels):
                feature = {
                    "px": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i + 1])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
        assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic: the files really are compressed
    features = {"image": "px", "label": "y", "encoding": "raw", "label_offset": 1}
    spec = _spec(
        "file:///x/t-*", "file:///x/e-*", features=features, shape=[4, 4, 3], classes=3, compression="gzip"
    )
    manifest = ShardManifest(
        source="x",
        encoding="raw",
        shape=[4, 4, 3],
        classes=["0", "1", "2"],
        splits={},
        created=0.0,
        locations={},
    )
    program = packed_program(spec.training, manifest)
    monkeypatch.chdir(tmp_path)
    shard = input_shard(_node(spec, "worker", 0, tmp_path / "results"), 0, 1)
    assert shard.compression == "GZIP"
    for data_set in (program.train_data(shard), program.eval_data()):
        images, labels = next(iter(data_set.batch(3)))
        assert labels.numpy().tolist() == [0, 1, 2]
        assert np.array_equal(np.rint(images.numpy() * 255).astype("uint8"), pixels)


def test_a_glob_in_moto_s3_lists_one_directory_and_nodes_may_read_only_there(
    tmp_path: Path, own_files: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "home"))
    s3 = s3_client(moto_endpoint)
    s3.create_bucket(Bucket="own-data")
    for split in ("train", "validation"):
        for path in sorted((own_files / split).iterdir()):
            s3.upload_file(str(path), "own-data", f"imagenet/{split}/{path.name}")
    s3.put_object(Bucket="own-data", Key="imagenet/train/old/train-00000-of-00001", Body=b"a sub-directory's")
    uri, eval_uri = "s3://own-data/imagenet/train/train-*", "s3://own-data/imagenet/validation/*"
    given = _spec(uri, eval_uri).model_copy(
        update={"storage": Spec().storage.model_copy(update={"endpoint_url": moto_endpoint})}
    )
    spec, note, listing = pinned_shards(given, own_disks=False)
    assert listing is not None and "8 train + 2 eval shards" in (note or "")
    train = json.loads(listing)["splits"]["train"]["shards"]
    etags = {o["Key"].rsplit("/", 1)[-1]: o["ETag"].strip('"') for o in s3.list_objects_v2(
        Bucket="own-data", Prefix="imagenet/train/train-")["Contents"]}  # fmt: skip
    assert {s["name"]: s["etag"] for s in train} == etags
    assert read_objects(spec) == ["own-data/imagenet/train/*", "own-data/imagenet/validation/*"]


def test_files_of_any_format_are_staged_by_name_for_the_users_own_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """format files: CSV parts (and a JSON one: the glob decides, not the suffix) staged under their
    own names, found by the pattern a program's Shard and a script's $DLINFRA_TRAIN_FILES give."""
    from dlinfra.node.script import staged_files
    from dlinfra.node.script_dirs import TRAIN_FILES

    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "home"))
    parts = tmp_path / "parts"
    parts.mkdir()
    for p in range(4):
        (parts / f"part-{p}.csv").write_text("".join(f"{p * 100 + i},{i % 2}\n" for i in range(5)))
    (parts / "part-4.json").write_text('{"id": 404}\n')
    uri = f"file://{parts}/part-*"
    with pytest.raises(ValidationError, match=r"format files are read by a program or script of yours"):
        Spec.model_validate({"training": {"dataset": {"format": "files", "uri": uri}}})
    given = Spec.model_validate(
        {"training": {"command": ["python", "train.py"], "dataset": {"format": "files", "uri": uri}}}
    )
    spec, note, listing = pinned_shards(given, own_disks=False)
    assert listing is not None and "5 train + 0 eval shards" in (note or "")
    sha256 = spec.training.dataset.sha256
    assert sha256 is not None
    results = tmp_path / "results"
    RunStore(open_store(f"file://{results}")).put_data_listing(sha256, listing)
    cfg = _node(spec, "worker", 1, results)
    work = tmp_path / "worker-1"
    node_data.stage_node(cfg, RunStore.open(cfg.store), work, lambda: None)
    assert sorted(p.name for p in (work / "shards" / "train").iterdir()) == ["part-1.csv", "part-4.json"]

    monkeypatch.chdir(work)  # the trainer's working directory
    shard = input_shard(cfg, 0, 1)
    assert [p.name for p in shard.files] == ["part-1.csv", "part-4.json"]
    lines = tf.data.Dataset.list_files(shard.pattern, shuffle=False).flat_map(tf.data.TextLineDataset)
    expected = [f"10{i},{i % 2}" for i in range(5)] + ['{"id": 404}']
    assert [line.decode() for line in lines.as_numpy_iterator()] == expected
    code = work / "code"
    code.mkdir()
    pattern = staged_files(cfg, work, code)[TRAIN_FILES]
    assert pattern == "../shards/train/*"
    assert sorted(p.name for p in code.glob(pattern)) == ["part-1.csv", "part-4.json"]
