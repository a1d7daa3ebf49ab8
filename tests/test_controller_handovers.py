"""Issue 55, class 3: the controller acts only on hand-overs this account's dlinfra sealed. Records
planted in its bucket's `controller/handovers/` (unreadable, of another shape, unsealed, sealed with
another key, pointing at another endpoint, bucket or a local directory, or with a swapped run dir)
steer nothing: each is quarantined and logged once, no other endpoint or bucket is contacted, and
the controller still goes idle on time. Real moto, real HTTP, the real controller loop in-process;
the same with the controller role's IAM enforced is tests/infra/test_controller_handovers_moto.py.

And class 9's last bullet: a deploy that starts the controller does not call it stopped."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from controller_runs import bucket, counting_endpoint, make_run

from dlinfra.contract import StoreConfig
from dlinfra.controller import Controller
from dlinfra.deploy import _Follow
from dlinfra.prepare import Prepared
from dlinfra.runs import handover
from dlinfra.runs.layout.controller import ControllerStore
from dlinfra.runs.ownership import Lease, claim
from dlinfra.runs.records import ControllerInfo, Handover
from dlinfra.runs.run import Run
from dlinfra.runs.sealing import read_key, seal
from dlinfra.targets.aws import AwsTarget
from dlinfra.targets.base import TargetOptions
from support import FAKE_CREDS, aws_client, run_cli

__all__ = ["bucket"]  # the fixture, for pytest

REGION = "us-east-1"


def _handed(run: Run, controller: ControllerStore) -> Handover:
    lease = claim(run.store(), "cli", "cli laptop")
    assert isinstance(lease, Lease)
    return handover.hand_over(run, run.store(), controller, lease, keep=False, emulate_instances=None)


def _idle_log(controller_store: ControllerStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The log of a controller run until it went idle (asserted within a minute)."""
    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "controller"))
    controller = Controller(controller_store, idle_minutes=0.02, poll=0.1, log_file=tmp_path / "c.log")
    looping = threading.Thread(target=controller.run, daemon=True)
    looping.start()
    looping.join(timeout=60)
    assert not looping.is_alive(), "the controller never went idle"
    return (tmp_path / "c.log").read_text()


def test_planted_handovers_are_quarantined_once_steer_nothing_and_the_controller_still_goes_idle(
    bucket: str, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = aws_client(moto_endpoint, "s3")
    other = f"{bucket}-other"[:63]
    s3.create_bucket(Bucket=other)
    controller_store = ControllerStore.of_bucket(bucket, moto_endpoint, REGION)
    # two runs handed over the way `deploy` does: one ended and torn down, one whose run dir was
    # swapped in the store after its hand-over was sealed
    ended = make_run(tmp_path / "laptop", bucket, moto_endpoint, monkeypatch)
    _handed(ended, controller_store)
    ended.store().write_marker("DONE")
    ended.update_manifest(destroyed=True)
    ended.publish_manifest()
    swapped = make_run(tmp_path / "laptop", bucket, moto_endpoint, monkeypatch)
    genuine = _handed(swapped, controller_store)
    swapped.store().put_run_dir(handover.pack(ended))
    key = read_key(bucket, REGION, moto_endpoint, create=True)
    assert key is not None
    local = tmp_path / "local-target"

    with counting_endpoint() as (stray, contacted):
        elsewhere = StoreConfig(url=f"s3://{other}/runs/{genuine.run_id}", endpoint_url=stray, region=REGION)
        mine_by_stray = StoreConfig(url=genuine.store.url, endpoint_url=stray, region=REGION)
        planted: dict[str, Any] = {
            "garbage.json": b"\x00\xff not json",
            "notes.txt": b"not a record",
            "huge.json": b"[" + b"0," * 60_000 + b"0]",  # more than a record: never read, left alone
            "nested/deeper.json": b"{}",
            "shape.json": {"schema_version": 1, "run_id": 5},
            "unsealed.json": genuine.model_copy(update={"store": elsewhere, "signature": None}),
            "forged.json": seal(genuine.model_copy(update={"store": mine_by_stray}), b"another key"),
            "resealed.json": genuine.model_copy(update={"store": elsewhere}),  # its seal, not its store
            "local.json": seal(
                genuine.model_copy(update={"store": StoreConfig(url=f"file://{local}")}), b"guessed"
            ),
        }
        # sealed by the CLI but naming an endpoint: the controller still reaches its bucket its own way
        given = controller_store.handovers()[0]
        assert given.run_id == ended.id
        controller_store.put_handover(
            seal(
                given.model_copy(update={"store": given.store.model_copy(update={"endpoint_url": stray})}),
                key,
            )
        )
        for name, body in planted.items():
            data = body.model_dump_json().encode() if isinstance(body, Handover) else body
            data = json.dumps(data).encode() if isinstance(data, dict) else data
            s3.put_object(Bucket=bucket, Key=f"controller/handovers/{name}", Body=data)

        monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "controller"))
        log_file = tmp_path / "controller" / "controller.log"
        controller = Controller(controller_store, idle_minutes=0.05, poll=0.1, log_file=log_file)
        started = time.monotonic()
        looping = threading.Thread(target=controller.run, daemon=True)
        looping.start()
        looping.join(timeout=90)
        took = time.monotonic() - started

    assert not looping.is_alive(), "the controller never went idle"
    assert took < 60, took
    assert contacted == []  # no request, signed or not, reached another endpoint
    assert "Contents" not in s3.list_objects_v2(Bucket=other) and not local.exists()
    log = log_file.read_text()
    for name in planted:
        assert log.count(f"controller/handovers/{name}: not acted on") == 1, (name, log)
    assert "not sealed with this bucket's hand-over key" in log and "not JSON" in log
    left_alone = {"huge.json", "nested/deeper.json"}
    quarantined = s3.list_objects_v2(Bucket=bucket, Prefix="controller/quarantine/")["Contents"]
    assert sorted(o["Key"].removeprefix("controller/quarantine/") for o in quarantined) == sorted(
        set(planted) - left_alone
    )
    # the genuine ones were verified: the ended run dropped, the swapped run dir refused, neither kept
    left = s3.list_objects_v2(Bucket=bucket, Prefix="controller/handovers/")["Contents"]
    assert {o["Key"].removeprefix("controller/handovers/") for o in left} == left_alone
    assert f"{len(planted['huge.json'])} bytes, more than a record's" in log
    assert f"run {swapped.id}: not taken up: " in log and "is not the one handed over" in log
    assert not (tmp_path / "controller" / "runs" / swapped.id).exists()
    assert key.decode() not in log


def test_a_controller_without_the_key_acts_on_nothing_says_so_once_and_goes_idle(
    bucket: str, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key in SSM (a bucket set up before sealing): no record can be verified, so none is acted
    on or quarantined (the fault is not theirs), and idle still comes."""
    controller_store = ControllerStore.of_bucket(bucket, moto_endpoint, REGION)
    run_id = "digits-20260101-000000-abcd"
    someone = Handover(
        run_id=run_id, store=StoreConfig(url=f"s3://{bucket}/runs/{run_id}"), by="someone", time=0
    )
    controller_store.put_handover(seal(someone, b"whatever key"))
    log = _idle_log(controller_store, tmp_path, monkeypatch)
    assert log.count("cannot verify hand-overs, acting on none") == 1, log
    assert "/dlinfra/controller/" in log and "Fix: " in log and "not acted on" not in log
    assert [h.run_id for h in controller_store.handovers()] == [run_id]  # left for a keyed look


def test_a_deploy_that_starts_the_stopped_controller_does_not_then_call_it_stopped(
    bucket: str, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ec2 = aws_client(moto_endpoint, "ec2")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    ec2.stop_instances(InstanceIds=[instance])
    controller_store = ControllerStore.of_bucket(bucket, moto_endpoint, REGION)
    info = ControllerInfo(
        holder=f"controller {instance}", instance_id=instance, idle_minutes=10, beat=0, state="stopped"
    )
    controller_store.put_info(info)
    run = make_run(tmp_path / "laptop", bucket, moto_endpoint, monkeypatch)
    lease = claim(run.store(), "cli", "cli laptop")
    assert isinstance(lease, Lease)
    said: list[str] = []

    class Target(AwsTarget):
        def ready_for_controller(self, run: Run) -> None:
            """Stand-in: moving a run stack's state needs the stack, which this run has none of."""

    options = TargetOptions(log=said.append)
    prepared = cast(Prepared, SimpleNamespace(run=run, store=run.store(), spec=run.spec()))
    _Follow(Target(options), prepared, options, False, lease)._hand_over(controller_store)

    assert any(f"controller {instance}: started (it was stopped)" in line for line in said), said
    assert not any("is stopped" in line for line in said), said
    state = ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] in ("pending", "running")


def test_a_planted_handover_neither_shows_as_a_pending_run_nor_blocks_destroying_the_controller(
    bucket: str, moto_endpoint: str, tmp_path: Path
) -> None:
    controller_store = ControllerStore.of_bucket(bucket, moto_endpoint, REGION)
    controller_store.put_info(
        ControllerInfo(holder="controller i-0abc", instance_id="i-0abc", idle_minutes=10, beat=time.time())
    )
    run_id = "digits-20260101-000000-beef"
    planted = Handover(run_id=run_id, store=StoreConfig(url=f"s3://{bucket}/runs/{run_id}"), by="x", time=0)
    controller_store.put_handover(seal(planted, b"not this bucket's key"))
    read_key(bucket, REGION, moto_endpoint, create=True)
    env = {"DLINFRA_HOME": str(tmp_path / "home"), **FAKE_CREDS}
    args = ["--bucket", bucket, "--endpoint-url", moto_endpoint]

    status = run_cli("controller", "status", *args, env=env)
    assert status.returncode == 0 and run_id not in status.stdout, status.stdout
    assert (
        "1 hand-over record(s) in s3://" in status.stdout
        and "not sealed by this account's dlinfra" in status.stdout
    )
    refused = run_cli("controller", "destroy", *args, env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "still owns" not in refused.stderr and "no controller stack was set up from this machine" in (
        refused.stderr
    )


def test_a_sealed_handover_whose_runs_records_do_not_read_is_said_once_and_keeps_nobody_busy(
    bucket: str, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever can write the run's prefix can plant a marker of another shape beside a genuine
    hand-over: the controller says so once and still goes idle (the next `watch` takes the run)."""
    controller_store = ControllerStore.of_bucket(bucket, moto_endpoint, REGION)
    run = make_run(tmp_path / "laptop", bucket, moto_endpoint, monkeypatch)
    _handed(run, controller_store)
    run.store().store.put_json("DONE", {"schema_version": 1, "marker": 5})
    log = _idle_log(controller_store, tmp_path, monkeypatch)
    assert log.count(f"run {run.id}: not taken up") == 1, log
    assert "not a valid Marker record" in log
