"""Hand-over and heal latency, with and without the CLI, side by side in one run, against a moto server
with instances emulated as processes (as tests/e2e/test_controller.py):

- hand-over: from `deploy --detach`'s exit to the controller owning the run (its lease in owner.json);
- heal, the CLI watching: from a worker's instance terminated through the EC2 API to its replacement
  applied (`deploy` in the foreground, `aws.controller: off`);
- heal, no CLI: the same, the run handed to a running controller.

A figure, not a limit: this machine is shared. Uses the provider mirror at /opt/tf-plugins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from emulated_aws import start_moto, terraform_rc

BUCKET = "bench-controller"
KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def _until(what: str, ready: Any, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := ready():
            return found
        time.sleep(0.2)
    raise SystemExit(f"bench: {what} not within {timeout:.0f}s")


def _step(log: Path) -> int:
    steps = re.findall(r" step (\d+)/", log.read_text(errors="replace")) if log.exists() else []
    return int(steps[-1]) if steps else 0


def _terminate_worker(ec2: Any, run_dir: Path) -> float:
    """Terminate worker-0's instance once the chief is past step 200; free its IP as AWS does (moto
    keeps it: the server runs in this process, so free it where moto keeps it)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    _until("step 200", lambda: _step(run_dir / "logs" / "chief-0.log") >= 200)
    instance = json.loads((run_dir / "manifest.json").read_text())["instances"]["worker-0"]
    old = ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]
    ec2.terminate_instances(InstanceIds=[instance])
    ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_subnet(old["SubnetId"]).del_subnet_ip(
        old["PrivateIpAddress"]
    )
    return time.time()


def _healed_after(manifest: dict[str, Any], terminated: float) -> float:
    return datetime.fromisoformat(manifest["heals"][0]["time"]).timestamp() - terminated


def main() -> None:
    import boto3

    server, endpoint = start_moto()
    work = Path(tempfile.mkdtemp(prefix="bench-controller-"))
    rc = terraform_rc(work)
    s3, ec2 = (boto3.client(service, endpoint_url=endpoint, **KEYS) for service in ("s3", "ec2"))
    s3.create_bucket(Bucket=BUCKET)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "TF_CLI_CONFIG_FILE": str(rc),
    }
    laptop, controller_home = work / "laptop", work / "controller"
    laptop.mkdir()
    args = ["--target", "aws", "--workers", "1", "--steps", "2000", "--yes", "--emulate-instances"]
    args += [
        "--endpoint-url",
        endpoint,
        "--set",
        f"storage.url=s3://{BUCKET}/runs",
        "--set",
        f"aws.ami={ami}",
    ]
    args += ["--set", "cluster.workers.gpus=0"]
    dl = [sys.executable, "-m", "dlinfra"]
    figures: dict[str, float] = {}

    # heal with the CLI watching (no controller has run for the bucket yet)
    cli = subprocess.Popen(
        [*dl, "deploy", *args], env=env | {"DLINFRA_HOME": str(laptop)}, cwd=laptop, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    run_dir = _until("the first run dir", lambda: next((laptop / "runs").glob("*/logs/chief-0.log"), None))
    terminated = _terminate_worker(ec2, run_dir.parent.parent)
    cli.communicate(timeout=900)
    figures["heal, the CLI watching"] = _healed_after(
        json.loads((run_dir.parent.parent / "manifest.json").read_text()), terminated
    )

    # hand-over, then heal with no CLI
    controller = subprocess.Popen(
        [*dl, "controller", "run", "--bucket", BUCKET, "--endpoint-url", endpoint, "--idle-minutes", "1.5"],
        env=env | {"DLINFRA_HOME": str(controller_home)}, cwd=work, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    owner_key = "controller/controller.json"
    _until(
        "the controller's first look",
        lambda: "Contents" in s3.list_objects_v2(Bucket=BUCKET, Prefix=owner_key),
    )
    handed = subprocess.run(
        [*dl, "deploy", *args, "--detach"], env=env | {"DLINFRA_HOME": str(laptop)}, cwd=laptop,
        text=True, capture_output=True, timeout=900, check=True,
    )  # fmt: skip
    exited = time.time()
    run_id = re.search(r"run (\S+): nodes are up, handed", handed.stdout)[1]  # type: ignore[index]

    def owned() -> bool:
        body = s3.get_object(Bucket=BUCKET, Key=f"runs/{run_id}/owner.json")["Body"].read()
        owner = json.loads(body)
        return owner["holder"].startswith("controller ") and owner["handed_to"] is None

    _until("the controller owning the run", owned, 120)
    figures["hand-over: CLI exit to the controller owning the run"] = time.time() - exited
    terminated = _terminate_worker(ec2, laptop / "runs" / run_id)
    controller.communicate(timeout=900)
    published = json.loads(s3.get_object(Bucket=BUCKET, Key=f"runs/{run_id}/manifest.json")["Body"].read())
    figures["heal, no CLI (the controller)"] = _healed_after(published, terminated)
    server.stop()

    print(f"{'what':<56} {'seconds':>8}")
    for what, seconds in figures.items():
        print(f"{what:<56} {seconds:8.1f}")


if __name__ == "__main__":
    main()
