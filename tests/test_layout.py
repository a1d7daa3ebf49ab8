"""The run-store layout: typed records go in and come back equal, records of another schema version
are refused with a message that says so, and checkpoint objects carry the tag the bucket's
lifecycle rule expires them by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlinfra.errors import StoreError
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import SCHEMA_VERSION, Metrics, NodeState
from dlinfra.runs.store_url import open_store
from support import FAKE_CREDS, Cli, s3_client


def _file_store(tmp_path: Path) -> RunStore:
    return RunStore(open_store((tmp_path / "store").as_uri()))


def _state(**changes: object) -> NodeState:
    base = {"node": "worker-1", "role": "worker", "index": 1, "state": "training", "started": 1.0}
    return NodeState(**(base | {"first_started": 1.0, "heartbeat": 2.0} | changes))


def test_records_round_trip_and_carry_their_schema_version(tmp_path: Path) -> None:
    store = _file_store(tmp_path)
    store.put_status(_state(step=7, loss=0.5))
    assert store.status("worker-1") == _state(step=7, loss=0.5)
    raw = json.loads((tmp_path / "store" / "status" / "worker-1.json").read_text())
    assert raw["schema_version"] == SCHEMA_VERSION and raw["step"] == 7
    assert store.status("worker-0") is None and store.metrics() is None and store.marker() is None


def test_the_first_marker_wins(tmp_path: Path) -> None:
    store = _file_store(tmp_path)
    store.write_marker("DONE", node="chief-0", step=10)
    store.write_marker("FAILED", node="worker-0", error="died late")
    marker = store.marker()
    assert marker is not None and (marker.marker, marker.node, marker.step) == ("DONE", "chief-0", 10)
    assert not (tmp_path / "store" / "FAILED").exists()


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ({"node": "worker-1", "state": "training", "heartbeat": 2.0}, "schema_version None"),
        ({"schema_version": SCHEMA_VERSION + 1, "node": "worker-1"}, f"schema_version {SCHEMA_VERSION + 1}"),
        ({"schema_version": SCHEMA_VERSION, "node": "worker-1"}, "not a valid NodeState record"),
    ],
    ids=["older dlinfra", "newer dlinfra", "right version, wrong shape"],
)
def test_a_record_of_another_layout_is_refused_by_name(tmp_path: Path, written: dict, says: str) -> None:
    store = _file_store(tmp_path)
    path = tmp_path / "store" / "status" / "worker-1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(written))
    with pytest.raises(StoreError, match=says) as err:
        store.status("worker-1")
    assert "status/worker-1.json" in str(err.value)


def test_metrics_keep_their_series_out_of_the_manifest_summary() -> None:
    metrics = Metrics(
        eval_accuracy=0.9,
        scalars={"eval_loss": 0.3, "eval_accuracy": 0.9},
        steps=10,
        total_steps=10,
        strategy="parameter_server",
        workers=2,
        ps=1,
        batch_size=64,
        train_seconds=3.0,
        finished_at=5.0,
        loss_series=[(1, 2.0)],
        model_uri="file:///m",
    )
    assert metrics.summary() == {
        "eval_accuracy": 0.9,
        "scalars": {"eval_loss": 0.3, "eval_accuracy": 0.9},
        "steps": 10,
        "train_seconds": 3.0,
        "model_uri": "file:///m",
    }


def test_checkpoint_objects_carry_the_lifecycle_tag_on_s3(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    s3 = s3_client(moto_endpoint)
    s3.create_bucket(Bucket="layout-tags")
    store = RunStore(open_store("s3://layout-tags/runs/r-1", endpoint_url=moto_endpoint))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "ckpt-5.index").write_bytes(b"index")
    (ckpt / "ckpt-5.data-00000-of-00001").write_bytes(b"data")
    pointer = store.put_checkpoint(5, ckpt)
    assert pointer.files == ["ckpt-5.data-00000-of-00001", "ckpt-5.index"]
    for name in pointer.files:
        tags = s3.get_object_tagging(Bucket="layout-tags", Key=f"runs/r-1/checkpoints/{name}")["TagSet"]
        assert tags == [{"Key": "dlinfra:kind", "Value": "checkpoint"}]
    assert store.latest_checkpoint() == pointer
    assert (
        store.get_checkpoint(pointer, tmp_path / "back")
        and (tmp_path / "back" / "ckpt-5.index").read_bytes() == b"index"
    )


def test_cli_names_a_run_recorded_by_another_dlinfra_and_exits_2(cli: Cli, home: Path) -> None:
    run_dir = home / "runs" / "old-run-20250101-000000-abcd"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"run_id": run_dir.name, "status": "DONE"}))
    shown = cli("show", run_dir.name)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "schema_version None" in shown.stderr and "Traceback" not in shown.stderr
    listed = cli("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["run_id"] == run_dir.name and row["status"].startswith("unreadable")
