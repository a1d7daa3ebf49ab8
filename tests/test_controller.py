"""The controller's records in moto's S3: a hand-over carries the run dir (and nothing it must not),
a new controller takes the run up from the bucket alone, and an idle controller says so and stops
its instance. The whole loop, with Terraform and a healed run, is tests/e2e/test_controller.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from controller_runs import bucket, make_run

from dlinfra.controller import Controller
from dlinfra.render.cloud_init import render_controller_user_data
from dlinfra.runs import handover
from dlinfra.runs.layout.controller import ControllerStore
from dlinfra.runs.ownership import PENDING, Lease, claim
from dlinfra.runs.records import ControllerInfo, Handover, Owner
from dlinfra.runs.sealing import read_key, seal
from dlinfra.spec.model import Spec
from support import FAKE_CREDS, assert_valid_cloud_config, aws_client, run_cli

__all__ = ["bucket"]  # the fixture, for pytest


def test_a_handed_over_run_is_taken_up_from_the_bucket_alone_and_reserved_for_the_controller(
    bucket: str, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(tmp_path / "laptop", bucket, moto_endpoint, monkeypatch)
    store = run.store()
    controller = ControllerStore.of_bucket(bucket, moto_endpoint, "us-east-1")
    lease = claim(store, "cli", "cli laptop")
    assert isinstance(lease, Lease)

    given = handover.hand_over(run, store, controller, lease, keep=False, emulate_instances="process")

    assert [h.run_id for h in controller.handovers()] == [run.id] and given.by == "cli laptop"
    owner, _ = store.owner()
    assert owner is not None and owner.holder == PENDING
    assert isinstance(claim(store, "cli", "cli other"), Owner)  # a watch meanwhile only follows

    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "controller"))  # another machine, empty
    taken = handover.take_up(controller.handovers()[0])
    assert taken.dir == tmp_path / "controller" / "runs" / run.id
    assert (taken.dir / "terraform" / "stack" / "main.tf").read_text() == "# the run's pinned HCL\n"
    assert (taken.dir / "user-data" / "chief-0.yaml").is_file() and (taken.dir / "tfvars.json").is_file()
    for left in ("terraform/stack/.terraform", "terraform/stack/terraform.tfstate", "logs"):
        assert not (taken.dir / left).exists(), left
    assert taken.manifest().handed_over and taken.spec() == run.spec()
    assert isinstance(claim(store, "controller", "controller i-1"), Lease)


def test_a_controller_on_a_machine_of_its_own_never_takes_the_deploying_machines_pids(
    bucket: str, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Emulated nodes are processes of the deploying machine: only a controller emulated as a process
    of that machine acts on them; one on EC2 (or a VM standing in) acts through the EC2 API alone."""
    controller = ControllerStore.of_bucket(bucket, moto_endpoint, "us-east-1")
    for emulated, home in (("process", "beside"), (None, "vm")):
        run = make_run(tmp_path / f"laptop-{home}", bucket, moto_endpoint, monkeypatch)
        run.update_manifest(pids={"chief-0": 4242, "worker-0": 4243})
        lease = claim(run.store(), "cli", "cli laptop")
        assert isinstance(lease, Lease)
        handover.hand_over(run, run.store(), controller, lease, keep=False, emulate_instances=emulated)
        monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / home))
        given = next(h for h in controller.handovers() if h.run_id == run.id)
        taken = handover.take_up(given)
        assert taken.manifest().pids == ({"chief-0": 4242, "worker-0": 4243} if emulated else {})


def test_an_idle_controller_says_so_in_the_bucket_syncs_its_log_and_stops_its_instance(
    bucket: str, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path / "controller"))
    store = ControllerStore.of_bucket(bucket, moto_endpoint, "us-east-1")
    # as `setup --emulate-instances=vm` registered it: every record the controller writes keeps it
    store.put_info(ControllerInfo(holder="controller i-0123", idle_minutes=0, beat=0, emulated="vm"))
    stopped: list[str] = []
    controller = Controller(
        store, idle_minutes=0.0, instance_id="i-0123", stop_instance=stopped.append, poll=0.1
    )

    said = controller.run()

    assert stopped == ["i-0123"] and "nothing to own for 0 min: stopping" in said
    info = store.info()
    assert info is not None and info.state == "stopped" and info.holder == "controller i-0123"
    assert info.emulated == "vm"
    assert store.logs() == ["controller-i-0123.log"]
    assert said in (store.log("controller-i-0123.log") or "")


def test_a_run_that_ended_and_was_torn_down_is_dropped_not_owned(
    bucket: str, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller replaced after the run ended and its stack went: nothing to own, the hand-over
    goes, and no lease is taken."""
    run = make_run(tmp_path / "laptop", bucket, moto_endpoint, monkeypatch)
    store = run.store()
    store.write_marker("DONE")
    run.update_manifest(destroyed=True)
    run.publish_manifest()
    controller_store = ControllerStore.of_bucket(bucket, moto_endpoint, "us-east-1")
    given = Handover(
        run_id=run.id, store=run.manifest().store, by="cli laptop", time=time.time(), run_dir_sha256="0" * 64
    )
    controller_store.put_handover(
        seal(given, read_key(bucket, "us-east-1", moto_endpoint, create=True) or b"")
    )
    controller = Controller(controller_store, idle_minutes=0.0, poll=0.1)

    controller.run()

    assert controller_store.handovers() == [] and store.owner() == (None, None)
    assert controller_store.store.list_keys("quarantine/") == []  # sealed: verified, then dropped


def test_controller_status_and_logs_without_a_controller_say_how_to_start_one(
    bucket: str, moto_endpoint: str, tmp_path: Path
) -> None:
    env = {"DLINFRA_HOME": str(tmp_path / "home"), **FAKE_CREDS}
    status = run_cli("controller", "status", "--bucket", bucket, "--endpoint-url", moto_endpoint, env=env)
    assert status.returncode == 0
    assert (
        f"no controller has run for s3://{bucket}: `dlinfra controller run --bucket {bucket}`"
        in status.stdout
    )
    bad = run_cli("controller", "status", "--bucket", "Bad_Bucket", "--endpoint-url", moto_endpoint, env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "Bad_Bucket" in bad.stderr


def test_setup_without_an_ami_boots_the_baked_controller_image_or_says_how_to_bake_one(
    moto_endpoint: str, tmp_path: Path
) -> None:
    """No controller AMI in the region: exit 2 naming the bake, and not even the bucket is made."""
    env = {"DLINFRA_HOME": str(tmp_path / "home"), **FAKE_CREDS}
    args = [
        "--bucket",
        "dlinfra-no-controller-image",
        "--region",
        "eu-south-1",
        "--endpoint-url",
        moto_endpoint,
    ]
    made = run_cli("setup", *args, "--controller", env=env)
    assert made.returncode == 2 and "Traceback" not in made.stderr, made.stderr
    assert "no controller image is baked for dlinfra" in made.stderr
    assert "dlinfra image build --target aws --flavor controller --set aws.region=eu-south-1" in made.stderr
    buckets = aws_client(moto_endpoint, "s3").list_buckets()["Buckets"]
    assert "dlinfra-no-controller-image" not in {b["Name"] for b in buckets}


def test_the_controllers_user_data_passes_cloud_init_schema_and_starts_it_at_every_boot(
    tmp_path: Path,
) -> None:
    text = render_controller_user_data("my-results", "eu-west-1", 10, endpoint_url=None)
    assert_valid_cloud_config(text, tmp_path / "controller.yaml")
    unit = next(f["content"] for f in yaml.safe_load(text)["write_files"] if f["path"].endswith(".service"))
    assert "controller run --bucket my-results --region eu-west-1 --idle-minutes 10 --instance-id" in unit
    assert "WantedBy=multi-user.target" in unit and "SuccessAction=poweroff" in unit
    assert "--endpoint-url" not in unit  # real AWS: no emulator endpoint


def test_destroying_a_controller_that_owns_a_run_is_refused_naming_the_run(
    bucket: str, moto_endpoint: str, tmp_path: Path
) -> None:
    store = ControllerStore.of_bucket(bucket, moto_endpoint, "us-east-1")
    info = ControllerInfo(
        holder="controller i-0abc", instance_id="i-0abc", idle_minutes=10, beat=time.time(), runs=["digits-1"]
    )
    store.put_info(info)
    env = {"DLINFRA_HOME": str(tmp_path / "home"), **FAKE_CREDS}
    args = ["--bucket", bucket, "--endpoint-url", moto_endpoint]
    refused = run_cli("controller", "destroy", *args, env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"the controller of s3://{bucket} still owns digits-1" in refused.stderr
    store.put_info(info.model_copy(update={"runs": []}))
    nowhere = run_cli("controller", "destroy", *args, env=env)
    assert nowhere.returncode == 2 and "no controller stack was set up from this machine" in nowhere.stderr
    assert store.info() == info.model_copy(update={"runs": []})  # refused: nothing removed


def test_a_run_whose_state_the_controller_cannot_reach_is_not_handed_to_it(
    bucket: str, moto_endpoint: str
) -> None:
    """The controller's role and VPC endpoint reach Terraform state in the results bucket only: a run
    with its own aws.state_bucket stays with the CLI, which says why."""
    from dlinfra.targets.aws import AwsTarget
    from dlinfra.targets.base import TargetOptions

    info = ControllerInfo(holder="controller i-0abc", instance_id="i-0abc", idle_minutes=10, beat=time.time())
    ControllerStore.of_bucket(bucket, moto_endpoint, "us-east-1").put_info(info)
    said: list[str] = []
    target = AwsTarget(TargetOptions(log=said.append))

    def spec(**aws: str) -> Spec:
        return Spec.model_validate(
            {
                "target": "aws",
                "storage": {"url": f"s3://{bucket}/runs"},
                "aws": {"endpoint_url": moto_endpoint, **aws},
            }
        )

    assert target.controller(spec()) is not None and said == []
    assert target.controller(spec(state_bucket=bucket)) is not None, "the results bucket itself is fine"
    assert target.controller(spec(state_bucket="team-terraform-state")) is None
    assert said and "not aws.state_bucket team-terraform-state: this run is not handed to it" in said[0]
