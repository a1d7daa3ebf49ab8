"""A script's outputs leave the node as the regular files under their directory, no more (issue 55,
class 1): a link out of the model, checkpoint or TensorBoard directory is refused and named, a FIFO
is skipped (never read: it would block), a sparse file counts by its full length against
training.outputs_max_gb. In process, against a real file:// store and moto's S3; the real run of a
script planting all of it is tests/e2e/test_script_failures.py."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from dlinfra.node.directory_sync import DirectorySync
from dlinfra.runs.layout import MODEL, SCRIPT_CHECKPOINTS, RunStore
from dlinfra.runs.local_files import OutputsTooBig, open_beneath, regular_files
from dlinfra.runs.store_url import open_store
from dlinfra.spec.training import TrainingSpec
from support import FAKE_CREDS, aws_client

SECRET = b"the node's own secret, never the script's output"


def _hostile_dir(tmp: Path, name: str) -> Path:
    """A directory as a hostile script leaves it: links out (to a file, to a directory), a link
    inside, a FIFO, a nested file."""
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.txt").write_bytes(SECRET)
    local = tmp / name
    (local / "sub").mkdir(parents=True)
    (local / "weights.bin").write_bytes(b"weights")
    (local / "sub" / "vars.index").write_bytes(b"index")
    (local / "leak").symlink_to(outside / "secret.txt")
    (local / "sub" / "up").symlink_to("../../outside/secret.txt")
    (local / "etc").symlink_to(outside)
    (local / "alias").symlink_to("weights.bin")
    os.mkfifo(local / "pipe")
    return local


def _stored(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_model_dir_uploads_only_its_regular_files_and_names_the_links_out(tmp_path: Path) -> None:
    store = RunStore(open_store(f"file://{tmp_path / 'store'}"))
    lines: list[str] = []
    store.put_model(_hostile_dir(tmp_path, "model"), refused=lines)
    stored = _stored(tmp_path / "store")
    assert stored == {
        f"{MODEL}/alias": b"weights",  # a link inside: the file it names, under its own name
        f"{MODEL}/sub/vars.index": b"index",
        f"{MODEL}/weights.bin": b"weights",
    }
    refused = "\n".join(lines)
    for name in ("'leak'", "'sub/up'", "'etc'"):
        assert f"DLINFRA_MODEL_DIR: {name} is a link out of it: refused" in refused
    assert "'pipe' is not a regular file" in refused
    assert "secret" not in refused, "a line names the link, never what it points to"


def test_directory_sync_sends_no_link_out_and_no_fifo(tmp_path: Path) -> None:
    store = RunStore(open_store(f"file://{tmp_path / 'store'}"))
    sync = DirectorySync(store, _hostile_dir(tmp_path, "ckpt"), SCRIPT_CHECKPOINTS, "DLINFRA_CHECKPOINT_DIR")
    assert sync.push(final=True) == 3
    assert all(SECRET not in data for data in _stored(tmp_path / "store").values())
    assert sorted(store.synced(SCRIPT_CHECKPOINTS)) == ["alias", "sub/vars.index", "weights.bin"]
    assert len(sync.refused) == 4 and sync.push(final=True) == 0


def test_a_file_swapped_for_a_link_after_the_look_is_not_opened(tmp_path: Path) -> None:
    """The script still runs while its checkpoints sync: what was a file at the listing may be a link
    (or a FIFO, or a directory holding a link) when it is opened."""
    local = _hostile_dir(tmp_path, "ckpt")
    opened = open_beneath(local, "weights.bin")
    assert opened is not None and opened.read() == b"weights"
    opened.close()
    (local / "weights.bin").unlink()
    (local / "weights.bin").symlink_to(tmp_path / "outside" / "secret.txt")
    assert open_beneath(local, "weights.bin") is None
    (local / "sub" / "vars.index").unlink()
    (local / "sub").rename(local / "sub.old")
    (local / "sub").symlink_to(tmp_path / "outside")
    assert open_beneath(local, "sub/secret.txt") is None
    assert open_beneath(local, "pipe") is None, "a FIFO is not waited on"


def test_a_sparse_file_counts_by_its_full_length_against_the_cap(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "saved_model.pb").write_bytes(b"pb")
    with open(model / "variables.data", "wb") as sparse:  # 30 GB that take no disk
        sparse.truncate(30 * 10**9)
    store = RunStore(open_store(f"file://{tmp_path / 'store'}"))
    cap = TrainingSpec().outputs_max_gb
    assert cap == 20
    with pytest.raises(OutputsTooBig) as refused:
        store.put_model(model, cap)
    assert "training.outputs_max_gb (20 GB)" in str(refused.value) and "30 GB" in str(refused.value)
    assert not (tmp_path / "store").exists(), "nothing of it was uploaded"
    sync = DirectorySync(store, model, SCRIPT_CHECKPOINTS, "DLINFRA_CHECKPOINT_DIR", cap)
    with pytest.raises(OutputsTooBig, match="DLINFRA_CHECKPOINT_DIR holds 30 GB"):
        sync.push(final=True)


def test_s3_receives_the_regular_files_as_listed(
    tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    s3 = aws_client(moto_endpoint, "s3")
    s3.create_bucket(Bucket="outputs-test")
    store = RunStore(open_store("s3://outputs-test/runs/r-1", endpoint_url=moto_endpoint))
    local = _hostile_dir(tmp_path, "tensorboard")
    store.put_model(local)
    sync = DirectorySync(store, local, SCRIPT_CHECKPOINTS)
    assert sync.push(final=True) == 3
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="outputs-test")["Contents"])
    assert keys == [
        f"runs/r-1/{prefix}/{rel}"
        for prefix in sorted((MODEL, SCRIPT_CHECKPOINTS))
        for rel in ("alias", "sub/vars.index", "weights.bin")
    ]
    body = s3.get_object(Bucket="outputs-test", Key=f"runs/r-1/{MODEL}/weights.bin")["Body"].read()
    assert body == b"weights"


READERS = """
import sys
from pathlib import Path
from dlinfra.node.events import EventScalars
from dlinfra.progress import read_report
root = Path(sys.argv[1])
print(read_report(root / "progress.json"), EventScalars(root / "tensorboard").read())
"""


def _read_in_a_child(root: Path) -> subprocess.CompletedProcess[str]:
    def bounded() -> None:  # an endless read must fail in the child, not fill the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (2**31, 2**31))

    return subprocess.run(
        [sys.executable, "-c", READERS, str(root)],
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=bounded,
    )


def test_the_agents_readers_of_a_scripts_files_follow_no_link_and_wait_on_no_fifo(tmp_path: Path) -> None:
    """The agent reads a script's progress file and event files while it runs: a link to an endless
    device must not spin it, a FIFO must not block it, a record's length must not size a read. In a
    child with a deadline: the agent's old readers hung on every one of these."""
    (tmp_path / "progress.json").symlink_to("/dev/zero")
    board = tmp_path / "tensorboard"
    (board / "run").mkdir(parents=True)
    (board / "events.out.tfevents.1.zero").symlink_to("/dev/zero")
    os.mkfifo(board / "events.out.tfevents.2.fifo")
    # a record header claiming 2**62 bytes
    (board / "run" / "events.out.tfevents.3.huge").write_bytes((2**62).to_bytes(8, "little") + b"\0" * 8)
    done = _read_in_a_child(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "False"]
    os.unlink(tmp_path / "progress.json")
    os.mkfifo(tmp_path / "progress.json")
    done = _read_in_a_child(tmp_path)
    assert done.stdout.split() == ["None", "False"], done.stderr


def test_a_restore_writes_nothing_through_a_folder_an_earlier_life_linked_out(tmp_path: Path) -> None:
    store = RunStore(open_store(f"file://{tmp_path / 'store'}"))
    local = tmp_path / "ckpt"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "ckpt-1.index").write_bytes(b"index")
    (local / "checkpoint").write_bytes(b"state")
    assert DirectorySync(store, local, SCRIPT_CHECKPOINTS).push(final=True) == 2
    (local / "sub" / "ckpt-1.index").unlink()
    (local / "sub").rmdir()
    (tmp_path / "elsewhere").mkdir()
    (local / "sub").symlink_to(tmp_path / "elsewhere")
    assert DirectorySync(store, local, SCRIPT_CHECKPOINTS).pull() == 1
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_directory_nested_past_the_recursion_limit_is_listed(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    levels = [model]
    try:
        for _ in range(1100):  # deeper than Python's recursion limit (1000), within PATH_MAX
            levels.append(levels[-1] / "d")
            levels[-1].mkdir()  # one at a time: mkdir(parents=True) itself recurses
        (levels[-1] / "weights.bin").write_bytes(b"deep")
        [found] = regular_files(model, "DLINFRA_MODEL_DIR").files
        assert found.size == 4 and found.rel.endswith("/d/weights.bin")
        opened = open_beneath(model, found.source)
        assert opened is not None and opened.read() == b"deep"
        opened.close()
    finally:  # shutil.rmtree recurses too: pytest's own clean-up of old temp dirs would fail on it
        (levels[-1] / "weights.bin").unlink(missing_ok=True)
        for level in reversed(levels):
            level.rmdir()
