"""The account's controller against moto: `dlinfra setup --controller` applies its stack (an instance
under the controller role, in a VPC of its own), which stops itself when idle; `deploy --detach`
starts it again and hands the run over, and the laptop's CLI is gone; the controller heals a worker
whose instance is terminated, ends the run DONE, destroys its stack and stops its instance again.
What this stands in for: EC2 boots. Instances are emulated as processes, as in test_aws_emulated:
the controller's instance is `dlinfra controller run` as its unit runs it, in a home of its own,
booted by whoever starts the instance.

The heal's own checks (only the vanished instance replaced, at its private IP, from the same
user-data; the worker's second life rejoined) are made here, once for every owner: a `deploy` in the
foreground heals with the same watch loop."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path

import pytest

from dlinfra.targets.aws.controller import emulated_pids
from e2e.conftest import (
    aws_emulation,
    instance_state,
    left_of,
    release_private_ip_as_aws_does,
    s3_json,
    set_up_controller,
    wait_for,
)
from support import aws_client, cli_process, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.terraform, pytest.mark.slow]
BUCKET = "dlinfra-controlled"
IDLE_MINUTES = 0.5


def test_setup_makes_a_controller_that_stops_when_idle_and_a_handed_over_run_is_healed_and_torn_down(
    moto_endpoint: str, tf_cli_config: Path, tmp_path: Path
) -> None:
    (tmp_path / "laptop").mkdir()
    aws = aws_emulation(moto_endpoint, tf_cli_config, tmp_path / "laptop", BUCKET, make_bucket=False)
    s3, ec2 = aws_client(moto_endpoint, "s3"), aws_client(moto_endpoint, "ec2")
    bucket_args = ["--bucket", BUCKET, "--endpoint-url", moto_endpoint]

    made, instance_id = set_up_controller(aws, BUCKET, "--emulate-instances", IDLE_MINUTES, aws["env"])
    state = lambda: instance_state(moto_endpoint, instance_id)  # noqa: E731
    assert re.search(
        rf"controller {instance_id} \(t3.medium, \$0.0416/h while it runs; stopped, only its 16 GiB gp3 disk "
        r"is billed, \$1.28/month\)",  # 16 GiB x $0.08/GB-month, the catalog's gp3 price
        made.stdout,
    ), made.stdout
    try:
        controller = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        tags = {t["Key"]: t["Value"] for t in controller["Tags"]}
        assert tags["dlinfra:role"] == "controller" and "dlinfra:run-id" not in tags
        assert controller["IamInstanceProfile"]["Arn"].endswith("/dlinfra-controller")
        # nothing to own: it says so and stops its own instance
        wait_for("the idle controller's instance stopped", lambda: state() == "stopped", 300)
        assert s3_json(s3, BUCKET, "controller/controller.json")["state"] == "stopped"
        wait_for("the controller's process gone", lambda: not emulated_pids(instance_id), 60)

        # One worker: the chief waits for it, so the run cannot end before the replacement trains.
        # The worker is terminated once the chief's published status (its beacon's, every few seconds)
        # says it trains: 3000 steps leave a minute of training after that. (The laptop's synced copy
        # of the chief's log lagged so far that a 2000-step run had ended before it showed step 200.)
        args = ["--target", "aws", "--workers", "1", "--steps", "3000", "--yes", "--emulate-instances"]
        args += ["--detach", *aws["args"]]
        handed = run_cli("deploy", *args, env=aws["env"], cwd=aws["cwd"], timeout=900)
        assert handed.returncode == 0, handed.stdout + handed.stderr
        assert f"controller {instance_id}: started (it was stopped)" in handed.stdout, handed.stdout
        assert "handed to the account's controller" in handed.stdout, handed.stdout
        run_id = re.search(r"run (\S+): nodes are up, handed", handed.stdout)[1]  # type: ignore[index]
        laptop_run = aws["home"] / "runs" / run_id
        # the laptop's state went to the bucket with the run: the controller acts from there
        assert not (laptop_run / "terraform" / "stack" / "terraform.tfstate").exists()
        assert "Contents" in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"dlinfra/{run_id}/terraform.tfstate")
        assert state() == "running"

        owner = wait_for(
            "the controller owning the run",
            lambda: (o := s3_json(s3, BUCKET, f"runs/{run_id}/owner.json")) and o["handed_to"] is None and o,
            120,
        )
        assert owner["kind"] == "controller" and owner["holder"] == f"controller {instance_id}"
        # a watch attached now only follows: it names the owner and applies nothing
        watch = cli_process("watch", run_id, env=aws["env"], cwd=aws["cwd"])

        def chief_step() -> int:
            return int((s3_json(s3, BUCKET, f"runs/{run_id}/status/chief-0.json") or {}).get("step") or 0)

        wait_for("step 50 of the chief", lambda: chief_step() >= 50, 300)
        assert chief_step() < 3000, "the run ended before its worker could be terminated"
        before = json.loads((laptop_run / "manifest.json").read_text())["instances"]
        worker = before["worker-0"]
        old = ec2.describe_instances(InstanceIds=[worker])["Reservations"][0]["Instances"][0]
        ec2.terminate_instances(InstanceIds=[worker])
        release_private_ip_as_aws_does(old)

        followed, _ = watch.communicate(timeout=900)
        assert watch.returncode == 0, followed
        assert f"run {run_id} is owned by controller {instance_id}: following it only" in followed
        assert "stack destroyed" not in followed and "terraform" not in followed.lower()
        assert s3_json(s3, BUCKET, f"runs/{run_id}/DONE") is not None

        # the controller replaced the worker, recorded it, tore the stack down, and stopped again
        wait_for("the controller's instance stopped again", lambda: state() == "stopped", 600)
        assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="controller/handovers/")
        published = s3_json(s3, BUCKET, f"runs/{run_id}/manifest.json")
        assert [h["node"] for h in published["heals"]] == ["worker-0"]
        assert published["status"] == "DONE" and published["destroyed"] is True
        nothing: dict[str, list[str]] = {"instances": [], "vpcs": [], "nat_gateways": [], "eips": []}
        assert left_of(moto_endpoint, run_id) == nothing
        assert s3_json(s3, BUCKET, f"runs/{run_id}/metrics.json")["steps"] == 3000
        # only the vanished instance was replaced: at its private IP, from the same user-data; the new
        # worker rejoined before the end (its status is its second life's)
        after = published["instances"]
        assert after["worker-0"] != worker
        assert {k: v for k, v in after.items() if k != "worker-0"} == {
            k: v for k, v in before.items() if k != "worker-0"
        }
        new = ec2.describe_instances(InstanceIds=[after["worker-0"]])["Reservations"][0]["Instances"][0]
        assert new["PrivateIpAddress"] == old["PrivateIpAddress"]
        user_data = [
            ec2.describe_instance_attribute(InstanceId=i, Attribute="userData")["UserData"]["Value"]
            for i in (worker, after["worker-0"])
        ]
        assert user_data[0] == user_data[1]
        status = s3_json(s3, BUCKET, f"runs/{run_id}/status/worker-0.json")
        assert status["state"] != "replacing" and status["restarts"] == 1, status

        logs = run_cli("controller", "logs", *bucket_args, env=aws["env"], cwd=aws["cwd"]).stdout
        assert f"run {run_id}: owned (handed over by cli " in logs, logs
        assert f"run {run_id}: worker-0: replaced by i-" in logs
        assert f"run {run_id}: stack destroyed in " in logs
        assert logs.count(f"controller {instance_id}: nothing to own for 0.5 min: stopping") == 2
        status = run_cli("controller", "status", *bucket_args, env=aws["env"], cwd=aws["cwd"]).stdout
        assert f"controller {instance_id}: stopped" in status and "owns: nothing" in status

        # the laptop learns how it ended from the store
        rows = json.loads(run_cli("runs", "--json", env=aws["env"], cwd=aws["cwd"]).stdout)
        row = next(r for r in rows if r["run_id"] == run_id)
        assert row["status"] == "DONE" and row["resources_up"] is False

        # nothing handed over: its stack can go, and the bucket knows no controller any more
        gone = run_cli("controller", "destroy", *bucket_args, env=aws["env"], cwd=aws["cwd"], timeout=600)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert state() == "terminated"
        assert s3_json(s3, BUCKET, "controller/controller.json") is None
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "tag:dlinfra:purpose", "Values": ["controller"]}])["Vpcs"]
        assert vpcs == []
    finally:
        for pid in emulated_pids(instance_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out = aws["home"] / "emulated-controller" / "controller.out"
        print(out.read_text()[-5000:] if out.exists() else "no controller output")
