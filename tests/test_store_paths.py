"""Store keys and checkpoint names stay in their place: a planted record or pointer naming
'../' or an absolute path fails closed, before a byte is read or written."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlinfra.errors import StoreError
from dlinfra.node.checkpoints import CheckpointSync
from dlinfra.runs.layout import LATEST_CHECKPOINT, RunStore
from dlinfra.runs.s3_store import S3Store
from dlinfra.runs.store import LEFT_FOR, STAGING, FileStore, checked_key


def _planted_pointer(store_dir: Path, **pointer: object) -> None:
    path = store_dir / LATEST_CHECKPOINT
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": 1, **pointer}))


@pytest.mark.parametrize(
    "pointer",
    [
        {"step": 5, "prefix": "ckpt-5", "files": ["../../../../escaped"]},
        {"step": 5, "prefix": "ckpt-5", "files": ["ckpt-5./../../../../escaped"]},
        {"step": 5, "prefix": "../../../escaped", "files": ["ckpt-5.index"]},
        {"step": 5, "prefix": "ckpt-5", "files": ["/tmp/escaped"]},
    ],
    ids=["dotdot-file", "prefixed-dotdot-file", "dotdot-prefix", "absolute-file"],
)
def test_a_planted_checkpoint_pointer_that_leaves_the_work_dir_fails_closed(
    tmp_path: Path, pointer: dict
) -> None:
    store_dir, work = tmp_path / "store", tmp_path / "nodes" / "chief-0"
    _planted_pointer(store_dir, **pointer)
    # what the '../' names would reach from the store's side, so a follower would have bytes to copy
    (tmp_path / "escaped").write_bytes(b"planted")
    sync = CheckpointSync(RunStore(FileStore(f"file://{store_dir}")), work)
    with pytest.raises(StoreError, match="not a valid CheckpointPointer record"):
        sync.download_latest()
    written = [p for p in tmp_path.rglob("*") if p.is_file() and store_dir not in p.parents]
    assert written == [tmp_path / "escaped"], "a restore wrote outside its work dir"
    assert not work.exists() or not any(work.rglob("*"))


def test_a_good_pointer_restores_into_the_work_dir(tmp_path: Path) -> None:
    store_dir, work, ckpt = tmp_path / "store", tmp_path / "work", tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "ckpt-7.index").write_bytes(b"index")
    (ckpt / "ckpt-7.data-00000-of-00001").write_bytes(b"data")
    run_store = RunStore(FileStore(f"file://{store_dir}"))
    CheckpointSync(run_store, work).upload(7, ckpt)
    restored = CheckpointSync(run_store, work).download_latest()
    assert restored == work / "restore" / "ckpt-7" / "ckpt-7"
    assert (restored.parent / "ckpt-7.data-00000-of-00001").read_bytes() == b"data"


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a\\..\\b", "a\nb", ""])
def test_keys_that_leave_a_store_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(StoreError, match="would leave its store"):
        checked_key(key)
    with pytest.raises(StoreError):
        FileStore(f"file://{tmp_path}/store").put_bytes(key, b"x")
    with pytest.raises(StoreError):
        S3Store("s3://results-bucket/runs/r1").get_bytes(key)  # refused before any request
    assert not (tmp_path / "x").exists()


def test_a_symlink_inside_a_file_store_that_points_out_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (root / "status").symlink_to(tmp_path / "outside")
    with pytest.raises(StoreError, match="resolves outside"):
        FileStore(f"file://{root}").put_bytes("status/chief-0.json", b"{}")
    assert list((tmp_path / "outside").iterdir()) == []


WRITER = """
import sys
from dlinfra.runs.store import FileStore
FileStore(sys.argv[1]).put_opened("checkpoints/files/ckpt-2.data-00000-of-00001", sys.stdin.buffer)
"""


def test_a_writer_killed_mid_write_leaves_no_part_beside_the_keys_and_a_later_open_sweeps_it(
    tmp_path: Path,
) -> None:
    """A node's life ended with SIGKILL while it sent a checkpoint file (a cluster restarting together):
    the checkpoint folder holds what it held, as S3 would, and the writer's part goes once it is dead."""
    root = tmp_path / "store"
    url = f"file://{root}"
    FileStore(url).put_bytes("checkpoints/files/checkpoint", b'model_checkpoint_path: "ckpt-1"\n')
    writer = subprocess.Popen([sys.executable, "-c", WRITER, url], stdin=subprocess.PIPE)
    assert writer.stdin is not None
    writer.stdin.write(b"x" * 1_000_000)  # half a checkpoint: the writer waits for the rest
    writer.stdin.flush()
    staging = root / STAGING
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size for p in staging.glob("*")) and writer.poll() is None:
        assert time.monotonic() < deadline, "the writer never began its part"
        time.sleep(0.05)
    writer.kill()
    writer.wait()
    writer.stdin.close()
    [part] = staging.iterdir()
    assert part.name.startswith(f"{writer.pid}-")
    assert sorted(p.name for p in (root / "checkpoints" / "files").iterdir()) == ["checkpoint"]
    assert FileStore(url).list_keys("checkpoints/") == ["checkpoints/files/checkpoint"]
    assert part.exists(), "touched within LEFT_FOR: could be a write another pid namespace still streams"
    ours = staging / f"{os.getpid()}-still-writing"  # a live writer's, however old: kept
    ours.write_bytes(b"x")
    old = time.time() - LEFT_FOR - 5
    for path in (part, ours):
        os.utime(path, (old, old))
    FileStore(url)
    assert not part.exists() and ours.exists()


def test_a_write_that_fails_half_way_leaves_no_part_and_no_key(tmp_path: Path) -> None:
    class Breaks(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
            raise OSError("the source went away")

    store = FileStore(f"file://{tmp_path}")
    with pytest.raises(OSError, match="went away"):
        store.put_opened("checkpoints/files/ckpt-1.index", io.BufferedReader(Breaks()))
    assert store.list_keys("checkpoints/") == [] and list((tmp_path / STAGING).iterdir()) == []
