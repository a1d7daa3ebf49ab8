"""`dlinfra data pack`: real TFRecord shards of real images, read back with TensorFlow, in a local
directory and in moto's S3."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from dlinfra.runs.bundle import file_sha256
from dlinfra.runs.store_url import open_store
from dlinfra.training import shards
from support import FAKE_CREDS, digits_source, run_cli, s3_client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits() -> shards.Source:
    """Encoded once: 1797 PNGs."""
    return digits_source()


def test_digits_pack_into_shards_every_example_once_with_checksums(
    tmp_path: Path, digits: shards.Source
) -> None:
    source = digits
    manifest = shards.pack(source, open_store(f"file://{tmp_path}"), shards=6, eval_shards=2)
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest.model_dump(mode="json")
    ids: list[int] = []
    for name, split in manifest.splits.items():
        sizes = [s.records for s in split.shards]
        assert max(sizes) - min(sizes) <= 1, "examples dealt evenly"
        assert sum(sizes) == split.records == len(source.train if name == "train" else source.eval)
        assert sum(split.per_class.values()) == split.records
        for shard in split.shards:
            path = tmp_path / shard.name
            assert (file_sha256(path), path.stat().st_size) == (shard.sha256, shard.bytes)
            read = list(shards.records(path))
            assert len(read) == shard.records
            assert len({label for _, label, _ in read}) > 5, "each shard holds many classes"
            ids += [i for i, _, _ in read]
    assert sorted(ids) == list(range(len(source.train) + len(source.eval))), "every example once"
    assert manifest.splits["train"].shards[0].name == "train-00000-of-00006.tfrecord"

    # the image decodes to the source's pixels (PNG is lossless)
    first = manifest.splits["eval"].shards[0]
    example_id, label, encoded = next(shards.records(tmp_path / first.name))
    pixels = tf.io.decode_png(encoded).numpy()
    original = next(ex for ex in source.eval if ex.id == example_id)
    assert pixels.shape == (8, 8, 1) and label == original.label
    assert np.array_equal(pixels, original.image)


def test_the_same_source_packs_into_the_same_bytes(tmp_path: Path, digits: shards.Source) -> None:
    source = digits
    first = shards.pack(source, open_store(f"file://{tmp_path / 'a'}"), 4, 1)
    second = shards.pack(source, open_store(f"file://{tmp_path / 'b'}"), 4, 1)
    assert [s.sha256 for s in first.splits["train"].shards] == [
        s.sha256 for s in second.splits["train"].shards
    ]


def _image_directory(root: Path, per_class: int) -> None:
    rng = np.random.default_rng(0)
    for name, level in (("cats", 40), ("dogs", 200)):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = np.clip(rng.normal(level, 20, size=(12, 16, 3)), 0, 255).astype("uint8")
            (root / name / f"{i}.jpg").write_bytes(tf.io.encode_jpeg(image).numpy())
    (root / "dogs" / "notes.txt").write_text("not an image")


def test_a_directory_of_class_folders_packs_its_files_as_they_are(tmp_path: Path) -> None:
    _image_directory(tmp_path / "pets", 30)
    source = shards.directory_source(tmp_path / "pets", eval_fraction=0.2)
    assert source.classes == ["cats", "dogs"] and source.encoding == "as-is"
    manifest = shards.pack(source, open_store(f"file://{tmp_path / 'out'}"), 3, 1)
    assert manifest.splits["train"].records + manifest.splits["eval"].records == 60
    assert 3 <= manifest.splits["eval"].records <= 24
    _, label, encoded = next(shards.records(tmp_path / "out" / manifest.splits["train"].shards[0].name))
    folder = source.classes[label]
    assert any((tmp_path / "pets" / folder / f"{i}.jpg").read_bytes() == encoded for i in range(30))


def test_pack_from_the_cli_into_s3_and_its_refusals(tmp_path: Path, moto_endpoint: str) -> None:
    s3 = s3_client(moto_endpoint)
    s3.create_bucket(Bucket="team-data")
    env = {**os.environ, **FAKE_CREDS, "DLINFRA_CACHE": str(tmp_path / "cache")}
    done = run_cli(
        "data",
        "pack",
        "digits",
        "s3://team-data/digits",
        "--shards",
        "4",
        "--endpoint-url",
        moto_endpoint,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "train: 1438 examples in 4 shards" in done.stdout and "eval: 359 examples in 1 shards" in done.stdout
    )
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="team-data", Prefix="digits/")["Contents"]}
    assert "digits/manifest.json" in keys and "digits/train-00003-of-00004.tfrecord" in keys

    too_many = run_cli("data", "pack", "digits", str(tmp_path / "x"), "--eval-shards", "400", env=env)
    assert (
        too_many.returncode == 2
        and "--eval-shards 400" in too_many.stderr
        and "Traceback" not in too_many.stderr
    )
    (tmp_path / "one" / "cats").mkdir(parents=True)
    one_class = run_cli("data", "pack", str(tmp_path / "one"), str(tmp_path / "y"), env=env)
    assert one_class.returncode == 2 and "1 class sub-directories" in one_class.stderr
    cifar = run_cli("data", "pack", "cifar10", str(tmp_path / "z"), env=env)
    assert cifar.returncode == 2 and "--uri" in cifar.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists(), "nothing written on bad input"


def _names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def test_a_pack_lands_whole_replacing_an_earlier_one_or_changes_nothing(tmp_path: Path) -> None:
    """Issue 55, class 6: a repack into the same DEST once left the earlier pack's extra shards
    beside the new manifest, and every image file went in unread."""
    _image_directory(tmp_path / "pets", 10)
    (tmp_path / "pets" / "dogs" / "notes.txt").unlink()
    out = open_store(f"file://{tmp_path / 'out'}")
    shards.pack(shards.directory_source(tmp_path / "pets", 0.2), out, 4, 2)
    second = shards.pack(shards.directory_source(tmp_path / "pets", 0.2), out, 2, 1)
    named = {s.name for split in second.splits.values() for s in split.shards}
    assert _names(tmp_path / "out") == named | {"manifest.json"}, "no shard of the earlier pack left"
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}

    # a PNG by its signature whose body is none: decoded at pack time, named, and DEST untouched
    (tmp_path / "pets" / "cats" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    with pytest.raises(shards.PackError, match=r"cats/broken\.png: no image TensorFlow can decode"):
        shards.pack(shards.directory_source(tmp_path / "pets", 0.2), out, 3, 1)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert _names(tmp_path) == {"pets", "out"}, "nothing half-made beside DEST"


def test_a_repack_into_s3_removes_the_earlier_packs_other_shards(
    tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _image_directory(tmp_path / "pets", 10)
    monkeypatch.setattr(os, "environ", {**os.environ, **FAKE_CREDS})  # what the store's client reads
    s3 = s3_client(moto_endpoint)
    s3.create_bucket(Bucket="repack")
    s3.put_object(Bucket="repack", Key="pets/README.md", Body=b"the team's notes")
    dest = open_store("s3://repack/pets", endpoint_url=moto_endpoint, region="us-east-1")
    shards.pack(shards.directory_source(tmp_path / "pets", 0.2), dest, 4, 2)
    second = shards.pack(shards.directory_source(tmp_path / "pets", 0.2), dest, 2, 1)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="repack", Prefix="pets/")["Contents"]}
    named = {f"pets/{s.name}" for split in second.splits.values() for s in split.shards}
    assert keys == named | {"pets/manifest.json", "pets/README.md"}, "what no pack wrote is kept"
