"""Script mode's checkpoint sync keeps in the store what the script keeps, and restores only what a
restore reads (issue 56): pulls private to a node and atomic, the newest checkpoint only, deletions
mirrored once a newer checkpoint has landed, and under parameter servers no ps deleting another's
shards. Real DirectorySync objects against a real file:// store (and moto's S3 for the delete); the
real run is tests/e2e/test_script_mode.py's kill -9 of the MWMS guide."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlinfra.node import directory_sync
from dlinfra.node.checkpoint_state import parse_state
from dlinfra.node.directory_sync import DirectorySync
from dlinfra.runs.layout import SCRIPT_CHECKPOINTS, RunStore
from dlinfra.runs.store import Store
from dlinfra.runs.store_url import open_store
from support import FAKE_CREDS, aws_client


def _store(tmp: Path) -> RunStore:
    return RunStore(open_store(f"file://{tmp / 'store'}"))


def _write(local: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_text(text)


def _checkpoint(local: Path, prefix: str, *, shards: int = 1, state: bool = True, meta: bool = False) -> None:
    """The files TensorFlow writes for one checkpoint, and the state file naming it."""
    files = {f"{prefix}.index": f"index of {prefix}"}
    files |= {f"{prefix}.data-{i:05d}-of-{shards:05d}": f"shard {i} of {prefix}" for i in range(shards)}
    if meta:
        files[f"{prefix}.meta"] = f"graph of {prefix}"
    _write(local, files)
    if state:
        name = Path(prefix).name
        _write(local, {str(Path(prefix).parent / "checkpoint"): f'model_checkpoint_path: "{name}"\n'})


def _settle(sync: DirectorySync) -> None:
    sync.push()  # first look: sizes noted
    sync.push()  # second look: settled, sent (the state file last), and what the script dropped forgotten


class _Interleaved(RunStore):
    """A store whose first download lets another node's whole pull run before this one renames its
    file into place: the interleaving of two restarted workers on one machine, made deterministic."""

    def __init__(self, store: Store):
        super().__init__(store)
        self.meanwhile: list[DirectorySync] = []

    def get_synced(self, prefix: str, rel: str, path: Path) -> bool:
        got = super().get_synced(prefix, rel, path)
        while self.meanwhile:
            self.meanwhile.pop().pull()
        return got


def test_two_nodes_restoring_into_one_directory_never_meet(tmp_path: Path) -> None:
    writer = DirectorySync(_store(tmp_path), tmp_path / "written", SCRIPT_CHECKPOINTS)
    _checkpoint(tmp_path / "written", "ckpt-1")
    _settle(writer)
    shared = tmp_path / "work" / "checkpoints"  # the local target: one directory for the machine's nodes
    store = _Interleaved(open_store(f"file://{tmp_path / 'store'}"))
    first, second = (DirectorySync(store, shared, SCRIPT_CHECKPOINTS) for _ in range(2))
    store.meanwhile.append(second)
    assert first.pull() == 3, "the first node's pull completes although another pulled meanwhile"
    assert (shared / "ckpt-1.data-00000-of-00001").read_text() == "shard 0 of ckpt-1"
    assert sorted(os.listdir(shared)) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]


SLOW_PULL = """
import sys, time
from pathlib import Path
from dlinfra.node.directory_sync import DirectorySync
from dlinfra.runs.layout import SCRIPT_CHECKPOINTS, RunStore
from dlinfra.runs.store_url import open_store

class Slow(RunStore):  # stands in for a download of a large shard from S3: part written, then a wait
    def get_synced(self, prefix, rel, path):
        if rel == "checkpoint":  # the state file, read first into a scratch folder: as it is
            return super().get_synced(prefix, rel, path)
        path.write_bytes(b"half a shard")
        print("copying", flush=True)
        time.sleep(600)
        return False

DirectorySync(Slow(open_store(sys.argv[1])), Path(sys.argv[2]), SCRIPT_CHECKPOINTS).pull()
"""


def test_a_restore_killed_part_way_leaves_nothing_that_is_sent_and_the_next_life_clears_it(
    tmp_path: Path,
) -> None:
    """A life killed while it pulled a checkpoint (bench_chaos seed 743: a kill -9 of the owner as it
    restored) leaves its file in progress in the checkpoint folder. The next life must not send it
    into the store as a checkpoint file, and its own restore removes it."""
    writer = DirectorySync(_store(tmp_path), tmp_path / "written", SCRIPT_CHECKPOINTS)
    _checkpoint(tmp_path / "written", "ckpt-1")
    _settle(writer)
    local = tmp_path / "node"
    url = f"file://{tmp_path / 'store'}"
    pulling = subprocess.Popen([sys.executable, "-c", SLOW_PULL, url, str(local)], stdout=subprocess.PIPE)
    assert pulling.stdout is not None and pulling.stdout.readline() == b"copying\n"
    pulling.kill()
    pulling.wait()
    [left] = [p.name for p in local.iterdir()]
    assert left.endswith(f".{pulling.pid}.pulling")
    stored = sorted(_store(tmp_path).synced(SCRIPT_CHECKPOINTS))
    next_life = DirectorySync(_store(tmp_path), local, SCRIPT_CHECKPOINTS)
    next_life.push(final=True)  # a life that sends before it restores: a ps's, or one with nothing to restore
    assert sorted(_store(tmp_path).synced(SCRIPT_CHECKPOINTS)) == stored, "a file in progress was sent"
    beside = local / f".ckpt-1.index.abcd.{os.getpid()}.pulling"  # a restore under way on this machine
    beside.write_bytes(b"in progress")
    assert next_life.pull() == 3
    assert sorted(os.listdir(local)) == sorted(
        ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index", beside.name]
    )


def test_a_restart_pulls_the_newest_checkpoint_each_state_file_names(tmp_path: Path) -> None:
    local = tmp_path / "node"
    for n in (1, 2, 3):  # a script keeping every checkpoint: the state file names the newest
        _checkpoint(local, f"ckpt-{n}")
    for n in (1, 2):  # Keras' BackupAndRestore: its own state file in a folder of its own
        _checkpoint(local, f"backup/chief/ckpt-{n}")
    for n in (100, 200):  # an Estimator under a folder: v1 names, a .meta, absolute paths
        _checkpoint(local, f"estimator/model.ckpt-{n}", meta=True)
    _write(local, {"estimator/checkpoint": 'model_checkpoint_path: "/elsewhere/model.ckpt-200"\n'})
    _write(local, {"estimator/graph.pbtxt": "graph", "estimator/events.out.tfevents.1": "events"})
    _write(local, {"weights/w.index": "no state here", "weights/w.data-00000-of-00001": "kept whole"})
    _settle(DirectorySync(_store(tmp_path), local, SCRIPT_CHECKPOINTS))
    restored = tmp_path / "restored"
    DirectorySync(_store(tmp_path), restored, SCRIPT_CHECKPOINTS).pull()
    got = sorted(p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file())
    assert got == [
        "backup/chief/checkpoint",
        "backup/chief/ckpt-2.data-00000-of-00001",
        "backup/chief/ckpt-2.index",
        "checkpoint",
        "ckpt-3.data-00000-of-00001",
        "ckpt-3.index",
        "estimator/checkpoint",
        "estimator/events.out.tfevents.1",
        "estimator/graph.pbtxt",
        "estimator/model.ckpt-200.data-00000-of-00001",
        "estimator/model.ckpt-200.index",
        "estimator/model.ckpt-200.meta",
        "weights/w.data-00000-of-00001",
        "weights/w.index",
    ]


def test_the_state_file_is_read_as_tensorflow_writes_it() -> None:
    text = (
        b'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-2"\n'
        b'all_model_checkpoint_paths: "ckpt-3"\nall_model_checkpoint_timestamps: 1764650000.5\n'
        b"last_preserved_timestamp: 1764649000.1\n"
    )
    state = parse_state("sub/checkpoint", text)
    assert state.latest == "sub/ckpt-3" and state.kept == {"sub/ckpt-2", "sub/ckpt-3"}
    assert state.obsolete("sub/ckpt-1") and not state.obsolete("sub/ckpt-2")
    assert not state.obsolete("sub/ckpt-4"), "a newer checkpoint, its state not yet written, stays"
    assert parse_state("checkpoint", b'model_checkpoint_path: "a \\"q\\".ckpt"').latest == 'a "q".ckpt'


def test_the_store_drops_a_checkpoint_the_script_deleted_once_a_newer_one_landed(tmp_path: Path) -> None:
    store, local = _store(tmp_path), tmp_path / "chief"
    sync = DirectorySync(store, local, SCRIPT_CHECKPOINTS)
    _checkpoint(local, "ckpt-1")
    _write(local, {"notes.txt": "the script's own file"})
    _settle(sync)
    # CheckpointManager(max_to_keep=1) saves ckpt-2, writes the state, deletes ckpt-1
    _checkpoint(local, "ckpt-2")
    for name in ("ckpt-1.index", "ckpt-1.data-00000-of-00001"):
        (local / name).unlink()
    sync.push()
    assert "ckpt-1.index" in store.synced(SCRIPT_CHECKPOINTS), "kept until the state naming ckpt-2 landed"
    sync.push()
    assert sorted(store.synced(SCRIPT_CHECKPOINTS)) == [
        "checkpoint",
        "ckpt-2.data-00000-of-00001",
        "ckpt-2.index",
        "notes.txt",
    ]
    (local / "notes.txt").unlink()
    sync.push()
    assert "notes.txt" in store.synced(SCRIPT_CHECKPOINTS), "a file of no checkpoint leaves at the end only"
    sync.push(final=True)
    assert "notes.txt" not in store.synced(SCRIPT_CHECKPOINTS)
    # a restarted chief may drop what its earlier lives sent, restored or not (here an old checkpoint
    # an earlier dlinfra left behind)
    _write(tmp_path / "old", {"ckpt-0.index": "old"})
    DirectorySync(store, tmp_path / "old", SCRIPT_CHECKPOINTS).push(final=True)
    again = DirectorySync(store, tmp_path / "restarted", SCRIPT_CHECKPOINTS)
    assert again.pull() == 3
    _checkpoint(tmp_path / "restarted", "ckpt-3")
    for name in ("ckpt-2.index", "ckpt-2.data-00000-of-00001"):
        (tmp_path / "restarted" / name).unlink()
    _settle(again)
    assert sorted(store.synced(SCRIPT_CHECKPOINTS)) == [
        "checkpoint",
        "ckpt-3.data-00000-of-00001",
        "ckpt-3.index",
    ]


def test_each_ps_drops_only_its_own_shards_of_a_checkpoint_no_longer_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(directory_sync, "PEEK_SECONDS", -1.0)  # read the store's state at every push
    store = _store(tmp_path)
    chief = DirectorySync(store, tmp_path / "chief", SCRIPT_CHECKPOINTS, sole_sender=False)
    ps = [DirectorySync(store, tmp_path / f"ps-{i}", SCRIPT_CHECKPOINTS, sole_sender=False) for i in (0, 1)]

    def save(n: int) -> None:  # the chief writes the index and the state; each ps its own shard
        _write(tmp_path / "chief", {f"ckpt-{n}.index": f"index {n}"})
        for i, node in enumerate(ps):
            _write(node.local, {f"ckpt-{n}.data-{i:05d}-of-00002": f"ps-{i} shard of {n}"})
            _settle(node)
        _write(tmp_path / "chief", {"checkpoint": f'model_checkpoint_path: "ckpt-{n}"\n'})
        (tmp_path / "chief" / f"ckpt-{n - 1}.index").unlink(missing_ok=True)  # max_to_keep=1
        _settle(chief)

    save(1)
    save(2)
    for node in ps:
        node.push()  # the state naming ckpt-2 is in the store: ckpt-1's shards are not kept
    assert sorted(store.synced(SCRIPT_CHECKPOINTS)) == [
        "checkpoint",
        "ckpt-2.data-00000-of-00002",
        "ckpt-2.data-00001-of-00002",
        "ckpt-2.index",
    ]
    # ps-0 restarts on its machine (its own files still there) and restores both shards of ckpt-2
    ps[0] = DirectorySync(store, tmp_path / "ps-0", SCRIPT_CHECKPOINTS, sole_sender=False)
    assert ps[0].pull() == 4
    save(3)  # each ps sent its shard of ckpt-3 before the state naming it landed
    ps[0].push()
    left = store.synced(SCRIPT_CHECKPOINTS)
    assert "ckpt-2.data-00000-of-00002" not in left, "ps-0's own shard, sent in its earlier life"
    assert "ckpt-2.data-00001-of-00002" in left, "ps-1's shard: ps-0 restored it, never sent it"
    ps[1].push()
    assert sorted(store.synced(SCRIPT_CHECKPOINTS)) == [
        "checkpoint",
        "ckpt-3.data-00000-of-00002",
        "ckpt-3.data-00001-of-00002",
        "ckpt-3.index",
    ]


def test_s3_loses_what_the_script_deleted(
    tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    aws_client(moto_endpoint, "s3").create_bucket(Bucket="ckpt-test")
    store = RunStore(open_store("s3://ckpt-test/runs/r-1", endpoint_url=moto_endpoint))
    local = tmp_path / "chief"
    sync = DirectorySync(store, local, SCRIPT_CHECKPOINTS)
    _checkpoint(local, "model.ckpt-1", meta=True)
    _settle(sync)
    _checkpoint(local, "model.ckpt-2", meta=True)
    for suffix in ("index", "meta", "data-00000-of-00001"):
        (local / f"model.ckpt-1.{suffix}").unlink()
    _settle(sync)
    assert [rel for rel in store.synced(SCRIPT_CHECKPOINTS) if "ckpt-1" in rel] == []
    assert len(store.synced(SCRIPT_CHECKPOINTS)) == 4


def test_a_huge_file_named_checkpoint_is_no_state_and_never_read_whole(tmp_path: Path) -> None:
    local = tmp_path / "node"
    _checkpoint(local, "ckpt-1", state=False)
    _checkpoint(local, "ckpt-2", state=False)
    with (local / "checkpoint").open("wb") as fh:  # sparse: past the cap by its length, nothing on disk
        fh.truncate(directory_sync.MAX_STATE_BYTES + 1)
    sync = DirectorySync(_store(tmp_path), local, SCRIPT_CHECKPOINTS)
    _settle(sync)
    assert sync.landed == {}, "not parsed as a state file"
    restored = DirectorySync(_store(tmp_path), tmp_path / "restored", SCRIPT_CHECKPOINTS)
    assert restored.pull() == 5, "no state read: the folder restored whole"
