"""The built-in loop's progress reports (node.reporting.Progress): recorded on the training thread,
published beside it. Real files, real event files read back by TensorBoard, a real S3 outage (moto
down) under the chief's TensorBoard sync."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dlinfra.node.reporting import Progress


def chief_progress(tmp_path: Path, store_url: str | None = None, endpoint: str | None = None) -> Progress:
    from dlinfra.contract import StoreConfig
    from dlinfra.node.status import NodeStatus
    from dlinfra.runs.layout import RunStore
    from dlinfra.spec.training import TrainingSpec
    from support import staging_node

    cfg = staging_node("chief", 0, TrainingSpec(steps=1000), tmp_path / "results", (tmp_path / "d").as_uri())
    if store_url is not None:
        cfg = cfg.model_copy(update={"store": StoreConfig(url=store_url, endpoint_url=endpoint)})
    work = tmp_path / "work"
    work.mkdir()
    store = RunStore.open(cfg.store)
    status = NodeStatus(store, cfg.name, cfg.role, cfg.index, work)
    log = (tmp_path / "node.log").open("a", buffering=1)
    return Progress(cfg, store, status, work, log=log)


def test_every_report_reaches_the_log_and_tensorboard_and_the_status_holds_the_newest_fields(
    tmp_path: Path,
) -> None:
    """200 reports as fast as a loop makes them: each has its log line and its scalars, in order; the
    status file is written at most once a second, so it takes the newest of every field, a figure
    said only by an earlier report included; nothing is published after close()."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dlinfra.node.status import read_state, state_file

    progress = chief_progress(tmp_path)
    for step in range(10, 2010, 10):
        figures = {"own_pass_seconds": 0.25} if step == 20 else {}
        progress.report(step, 1.0 / step, 1000.0 + step, 0.1, **figures)
    progress.final({"accuracy": 0.93}, 2000)

    lines = [line for line in (tmp_path / "node.log").read_text().splitlines() if " step " in line]
    assert [int(line.split(" step ")[1].split("/")[0]) for line in lines] == list(range(10, 2010, 10))
    state = read_state(state_file(tmp_path / "work"))
    assert state is not None
    assert (state["step"], state["examples_per_sec"], state["own_pass_seconds"]) == (2000, 3000.0, 0.25)
    assert state["phases"]["first step"] == pytest.approx(progress.first_step_at, abs=1e-3)
    assert [s for _, s, _ in progress.series] == list(range(10, 2010, 10))

    acc = EventAccumulator(str(tmp_path / "results" / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    assert {"loss", "examples_per_sec", "input_wait", "eval_accuracy"} <= set(acc.Tags()["tensors"])
    assert [e.step for e in acc.Tensors("loss")] == list(range(10, 2010, 10))
    assert acc.Tensors("examples_per_sec")[-1].tensor_proto.float_val == [3000.0]

    before = state_file(tmp_path / "work").read_text()
    time.sleep(1.2)  # a publisher still running would write the status again within a second
    assert state_file(tmp_path / "work").read_text() == before


def test_a_chiefs_reports_and_status_go_on_while_its_tensorboard_sync_waits_out_a_store_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store down (moto stopped, connections refused) from the first report: its TensorBoard
    sync waits out the outage in a thread of its own, while the training thread's reports return at
    once and the status file, which the beacon judges stalls by, keeps up. Back up, the final sync
    brings every scalar to the store."""
    from dlinfra.node.events import EventScalars
    from dlinfra.node.status import read_state, state_file
    from stoppable_moto import StoppableMoto
    from support import FAKE_CREDS, s3_client

    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    moto = StoppableMoto()
    try:
        s3_client(moto.endpoint).create_bucket(Bucket="reports")
        progress = chief_progress(tmp_path, "s3://reports/run", moto.endpoint)
        moto.down()
        started = time.monotonic()
        progress.report(10, 0.5, 100.0, None)  # the first report syncs: into the outage
        took = time.monotonic() - started
        state = state_file(tmp_path / "work")
        for step in range(20, 60, 10):
            progress.report(step, 0.5, 100.0, None)
        deadline = time.monotonic() + 30
        while (read_state(state) or {}).get("step") != 50 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (read_state(state) or {}).get("step") == 50, "the status file waited for the store"
        assert took < 5, f"a report waited {took:.1f} s on the store"
        moto.up()
        progress.final({"accuracy": 0.9}, 50)
        pulled = tmp_path / "pulled"
        client = s3_client(moto.endpoint)
        for item in client.list_objects_v2(Bucket="reports", Prefix="run/tensorboard/")["Contents"]:
            target = pulled / item["Key"].rsplit("/", 1)[-1]
            target.parent.mkdir(exist_ok=True)
            client.download_file("reports", item["Key"], str(target))
        scalars = EventScalars(pulled)
        scalars.read()
        assert scalars.step == 50 and scalars.values["eval_accuracy"] == pytest.approx(0.9)
    finally:
        moto.stop()
