"""The account's controller against moto: `deploy --detach` hands the run over and the laptop's CLI
is gone; the controller (`dlinfra controller run`, a process here with a home of its own, standing in
for its instance) heals a worker whose instance is terminated, ends the run DONE, destroys its stack
and stops itself once idle. Instances are emulated as processes, as in test_aws_emulated."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import aws_emulation, release_private_ip_as_aws_does
from support import aws_client, cli_process, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.terraform, pytest.mark.slow]
BUCKET = "dlinfra-controlled"
IDLE_MINUTES = 0.5


def _s3_json(s3: Any, key: str) -> Any:
    try:
        return json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None


def _wait(what: str, ready: Any, timeout: float, controller: subprocess.Popen[str]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert controller.poll() is None, f"the controller exited while waiting for {what}"
        if found := ready():
            return found
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def _left_of(endpoint: str, run_id: str) -> dict[str, list[str]]:
    """What of the run is still in moto, by its run tag: instances not terminated, VPCs, NAT
    gateways not deleted, Elastic IPs."""
    ec2 = aws_client(endpoint, "ec2")
    tagged = [{"Name": "tag:dlinfra:run-id", "Values": [run_id]}]
    reservations = ec2.describe_instances(Filters=tagged)["Reservations"]
    return {
        "instances": [
            i["InstanceId"]
            for r in reservations
            for i in r["Instances"]
            if i["State"]["Name"] != "terminated"
        ],
        "vpcs": [v["VpcId"] for v in ec2.describe_vpcs(Filters=tagged)["Vpcs"]],
        "nat_gateways": [
            n["NatGatewayId"]
            for n in ec2.describe_nat_gateways(Filters=tagged)["NatGateways"]
            if n["State"] != "deleted"
        ],
        "eips": [a["AllocationId"] for a in ec2.describe_addresses(Filters=tagged)["Addresses"]],
    }


def test_a_handed_over_run_is_healed_ended_and_torn_down_by_the_controller_with_no_cli_left(
    moto_endpoint: str, tf_cli_config: Path, tmp_path: Path
) -> None:
    (tmp_path / "laptop").mkdir()
    aws = aws_emulation(moto_endpoint, tf_cli_config, tmp_path / "laptop", BUCKET)
    s3, ec2 = aws_client(moto_endpoint, "s3"), aws_client(moto_endpoint, "ec2")
    controller_env = aws["env"] | {"DLINFRA_HOME": str(tmp_path / "controller")}
    bucket_args = ["--bucket", BUCKET, "--endpoint-url", moto_endpoint]
    idle = ["--idle-minutes", str(IDLE_MINUTES)]
    # a controller that ran once and stopped, idle: the bucket knows it, stopped
    first = run_cli(
        "controller", "run", *bucket_args, "--idle-minutes", "0", env=controller_env, cwd=tmp_path
    )
    assert first.returncode == 0 and "nothing to own for 0 min: stopping" in first.stdout, first.stderr
    assert _s3_json(s3, "controller/controller.json")["state"] == "stopped"

    # One worker: the chief waits for it, so the run cannot end before the replacement trains.
    args = ["--target", "aws", "--workers", "1", "--steps", "2000", "--yes", "--emulate-instances"]
    args += ["--detach", *aws["args"]]
    handed = run_cli("deploy", *args, env=aws["env"], cwd=aws["cwd"], timeout=900)
    assert handed.returncode == 0, handed.stdout + handed.stderr
    assert "handed to the account's controller" in handed.stdout, handed.stdout
    assert "is stopped: it picks the run up when it runs again" in handed.stdout, handed.stdout
    run_id = re.search(r"run (\S+): nodes are up, handed", handed.stdout)[1]  # type: ignore[index]
    # the CLI is gone: the run is reserved for the controller, which comes back and takes it up
    controller = cli_process("controller", "run", *bucket_args, *idle, env=controller_env, cwd=tmp_path)
    try:
        laptop_run = aws["home"] / "runs" / run_id
        # the laptop's state went to the bucket with the run: the controller acts from there
        assert not (laptop_run / "terraform" / "stack" / "terraform.tfstate").exists()
        assert "Contents" in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"dlinfra/{run_id}/terraform.tfstate")

        owner = _wait(
            "the controller owning the run",
            lambda: (
                (o := _s3_json(s3, f"runs/{run_id}/owner.json"))
                and o["holder"].startswith("controller ")
                and o["handed_to"] is None
                and o
            ),
            120,
            controller,
        )
        assert owner["kind"] == "controller"
        # a watch attached now only follows: it names the owner and applies nothing
        watch = cli_process("watch", run_id, env=aws["env"], cwd=aws["cwd"])

        chief_log = laptop_run / "logs" / "chief-0.log"
        _wait(
            "step 200 of the chief",
            lambda: (
                int((re.findall(r" step (\d+)/", chief_log.read_text(errors="replace")) or ["0"])[-1]) >= 200
            ),
            300,
            controller,
        )
        worker = json.loads((laptop_run / "manifest.json").read_text())["instances"]["worker-0"]
        old = ec2.describe_instances(InstanceIds=[worker])["Reservations"][0]["Instances"][0]
        ec2.terminate_instances(InstanceIds=[worker])
        release_private_ip_as_aws_does(old)

        followed, _ = watch.communicate(timeout=900)
        assert watch.returncode == 0, followed
        assert f"run {run_id} is owned by {owner['holder']}: following it only" in followed
        assert "stack destroyed" not in followed and "terraform" not in followed.lower()
        assert _s3_json(s3, f"runs/{run_id}/DONE") is not None

        # the controller replaced the worker, recorded it, and tore the stack down
        _wait(
            "the controller finishing the run",
            lambda: "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="controller/handovers/"),
            600,
            controller,
        )
        published = _s3_json(s3, f"runs/{run_id}/manifest.json")
        assert [h["node"] for h in published["heals"]] == ["worker-0"]
        assert published["status"] == "DONE" and published["destroyed"] is True
        assert _left_of(moto_endpoint, run_id) == {
            "instances": [],
            "vpcs": [],
            "nat_gateways": [],
            "eips": [],
        }
        metrics = _s3_json(s3, f"runs/{run_id}/metrics.json")
        assert metrics["steps"] == 2000

        # idle: it says so in the bucket and stops
        controller.wait(timeout=IDLE_MINUTES * 60 + 120)
        assert controller.returncode == 0
        assert _s3_json(s3, "controller/controller.json")["state"] == "stopped"
        logs = run_cli("controller", "logs", *bucket_args, env=aws["env"], cwd=tmp_path)
        assert f"run {run_id}: owned (handed over by cli " in logs.stdout, logs.stdout
        assert f"run {run_id}: worker-0: replaced by i-" in logs.stdout
        assert f"run {run_id}: run {run_id}: stack destroyed" in logs.stdout
        assert "nothing to own for 0.5 min: stopping" in logs.stdout

        # the laptop learns how it ended from the store
        rows = json.loads(run_cli("runs", "--json", env=aws["env"], cwd=aws["cwd"]).stdout)
        row = next(r for r in rows if r["run_id"] == run_id)
        assert row["status"] == "DONE" and row["resources_up"] is False
    finally:
        if controller.poll() is None:
            controller.kill()
        out, err = controller.communicate(timeout=60)
        print(out[-5000:], err[-3000:])
