"""Wall time of `terraform apply` and `destroy` of the 3-worker stack (1 chief, 3 workers, 1 ps)
against a moto server, through `dlinfra plan`/`deploy --keep`/`destroy`. Goal: apply <= 60 s.
Uses the provider mirror at /opt/tf-plugins when present (offline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from emulated_aws import start_moto, terraform_rc


def main() -> None:
    os.environ["MOTO_IAM_LOAD_MANAGED_POLICIES"] = "true"
    import boto3

    server, endpoint = start_moto()
    work = Path(tempfile.mkdtemp())
    rc = terraform_rc(work)
    creds = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    env = dict(os.environ, **creds, DLINFRA_HOME=str(work / "home"), TF_CLI_CONFIG_FILE=str(rc))
    kw = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    boto3.client("s3", **kw).create_bucket(Bucket="bench-results")
    ami = boto3.client("ec2", **kw).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    args = [
        "--target",
        "aws",
        "--endpoint-url",
        endpoint,
        "--workers",
        "3",
        "--set",
        "storage.url=s3://bench-results/runs",
        "--set",
        f"aws.ami={ami}",
        "--set",
        "training.steps=20",
        # emulated instances are processes on this machine, which has no GPU for a g4dn's worker
        "--set",
        "cluster.workers.gpus=0",
    ]
    dl = [sys.executable, "-m", "dlinfra"]
    t0 = time.perf_counter()
    subprocess.run(
        [*dl, "deploy", *args, "--yes", "--keep", "--emulate-instances"],
        check=True,
        env=env,
        capture_output=True,
    )
    total = time.perf_counter() - t0
    run_dir = next((work / "home" / "runs").iterdir())
    subprocess.run([*dl, "destroy", run_dir.name], check=True, env=env, capture_output=True)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    server.stop()
    print(f"{'step':<44} {'seconds':>8} {'goal':>6}")
    print(f"{'terraform apply (28 resources, 5 instances)':<44} {manifest['apply_seconds']:8.1f} {'60':>6}")
    print(f"{'terraform destroy':<44} {manifest['destroy_seconds']:8.1f} {'-':>6}")
    print(f"{'deploy end to end (plan+apply+20-step run)':<44} {total:8.1f} {'-':>6}")


if __name__ == "__main__":
    main()
