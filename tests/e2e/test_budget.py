"""cluster.max_cost on the aws target, emulated: terraform against moto, the instances' own user-data
booted as local node processes (--emulate-instances). What this stands in for: real EC2 boots and
billing (no AWS here); the prices are the catalog's, as the nodes and the CLI use them."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from dlinfra.contract import BUDGET_CHECKPOINT_SECONDS
from dlinfra.spec.catalog import catalog
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.spec.model import Spec
from dlinfra.spec.pricing import BOOT_SECONDS
from e2e.conftest import aws_emulation, own_files_args
from support import FAKE_CREDS, cgroup_cpu_limit, cli_process, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.terraform, pytest.mark.slow]
BUCKET = "dlinfra-budget"
# A name no other run on this home has: no earlier run times its steps, so the least budget plan
# accepts is BOOT_SECONDS of the cluster (spec.pricing.FirstCheckpoint).
NAME = "budget-digits"
BUDGET_SECONDS = BOOT_SECONDS + 30
# The cap is kept by the clock, whatever the node gets done by then: a run held to half a CPU is kept
# the same way, for a fraction of the CPU (its first step still comes well inside the cap).
RUN_CPUS = 0.5


@pytest.fixture(scope="module")
def aws_env(
    moto_endpoint: str, tf_cli_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return aws_emulation(moto_endpoint, tf_cli_config, tmp_path_factory.mktemp("budget-home"), BUCKET)


def _catalog_rate(spec: Spec) -> float:
    """The cluster's $/h by the catalog, added up here: every node's on-demand price and the NAT
    gateway (egress nat, or auto as moto's plan settles it: no AMI is baked there)."""
    region, prices = spec.aws.region, catalog()
    rate = sum(shape.count * prices.get(shape.instance_type).price(region) for shape in spec.roles().values())
    if spec.aws.egress in ("nat", "auto"):
        rate += prices.nat_gateway_usd_per_hour[region]
    return rate


def _deploy(aws_env: dict[str, Any], max_cost: float, *extra: str) -> subprocess.CompletedProcess[str]:
    """The run, its whole process tree held to RUN_CPUS: only the cap ends it, and a node training
    flat out on a loaded machine for the cap's length was the suite's dearest test (262 CPU-s)."""
    deploy = cli_process(
        "deploy",
        "--target",
        "aws",
        "--workers",
        "1",
        # one node (worker 0 is the chief): the cap is the cluster's, whatever its shape
        "--strategy",
        "multi_worker_mirrored",
        "--steps",
        "1000000",  # only the budget ends it
        "--yes",
        "--emulate-instances",
        "--set",
        f"name={NAME}",
        "--set",
        f"cluster.max_cost={max_cost}",
        *extra,
        *aws_env["args"],
        env=aws_env["env"],
        cwd=aws_env["cwd"],
    )
    with cgroup_cpu_limit(required=False)(deploy.pid, RUN_CPUS):
        try:
            out, err = deploy.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            deploy.kill()  # as subprocess.run would: never left running beside the next tests
            raise
    return subprocess.CompletedProcess(deploy.args, deploy.returncode, out, err)


def test_a_cap_below_the_first_checkpoint_is_refused_with_exit_2_and_nothing_made(
    aws_env: dict[str, Any],
) -> None:
    ec2 = boto3.client("ec2", endpoint_url=aws_env["endpoint"], region_name="us-east-1", **_keys())
    runs = aws_env["home"] / "runs"
    before = (set(runs.iterdir()) if runs.exists() else set(), _instances(ec2))
    result = _deploy(aws_env, 0.0001)  # seconds of any priced cluster
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "cluster.max_cost: $0.0001 buys" in result.stderr and "Fix: set it to" in result.stderr, (
        result.stderr
    )
    assert (set(runs.iterdir()) if runs.exists() else set(), _instances(ec2)) == before, "nothing made"


def test_the_run_checkpoints_at_its_cap_and_stops_with_the_budget_verdict_at_the_catalogs_price(
    aws_env: dict[str, Any], s3_own_files: str
) -> None:
    """A cap worth BUDGET_SECONDS of the cluster, training on a user's own TFRecord files in S3: the
    chief checkpoints at the cap, the run is STOPPED with verdict budget, the stack is destroyed, and
    the cost shown is the catalog's arithmetic."""
    overrides = Overrides(target="aws", workers=1, strategy="multi_worker_mirrored", sets=[f"name={NAME}"])
    rate = _catalog_rate(load_spec(None, overrides))
    max_cost = round(rate * BUDGET_SECONDS / 3600, 6)

    result = _deploy(aws_env, max_cost, *own_files_args(s3_own_files))
    assert result.returncode == 1, result.stdout + result.stderr
    run_dir = sorted((aws_env["home"] / "runs").iterdir())[-1]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "STOPPED" and manifest["destroyed"], manifest
    assert manifest["plan"]["usd_per_hour"] == pytest.approx(rate), "the plan prices it as the catalog"
    s3 = boto3.client("s3", endpoint_url=aws_env["endpoint"], region_name="us-east-1", **_keys())
    prefix = f"runs/{run_dir.name}/"

    def stored(key: str) -> dict[str, Any]:
        return json.loads(s3.get_object(Bucket=BUCKET, Key=prefix + key)["Body"].read())

    marker = stored("STOPPED")
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "status/")["Contents"]
    nodes = [stored(o["Key"].removeprefix(prefix)) for o in listed]
    assert marker["verdict"] == "budget" and marker["reason"].startswith("budget: cluster.max_cost"), marker
    pointer = stored("checkpoints/latest.json")
    assert marker["last_checkpoint"] == pointer["prefix"], (marker, pointer)
    # the checkpoint kept is the one taken at the cap, not an earlier periodic one: each node keeps the
    # cap by its own clock from its own start, and the first to reach it asks for the checkpoint
    cap_at = min(node["first_started"] for node in nodes) + max_cost / rate * 3600
    assert cap_at - 1 <= pointer["time"] <= cap_at + BUDGET_CHECKPOINT_SECONDS, (cap_at, pointer, nodes)
    assert marker["time"] >= pointer["time"]
    assert f"run {run_dir.name} STOPPED: budget: cluster.max_cost ${max_cost:g} spent" in result.stderr
    assert f"last checkpoint s3://{BUCKET}/{prefix}checkpoints/{pointer['prefix']}" in result.stderr

    shown = re.search(r"cost: \$([0-9.]+) at \$([0-9.]+)/h since the nodes started", result.stderr)
    assert shown, result.stderr
    assert float(shown[2]) == pytest.approx(rate, abs=0.0005)
    ran = datetime.fromisoformat(manifest["finished"]) - datetime.fromisoformat(manifest["started"])
    assert float(shown[1]) == pytest.approx(rate * ran.total_seconds() / 3600, abs=0.0001)
    listed = json.loads(run_cli("runs", "--json", env=aws_env["env"], cwd=aws_env["cwd"], timeout=120).stdout)
    row = next(r for r in listed if r["run_id"] == run_dir.name)
    assert row["usd_spent"] == pytest.approx(float(shown[1]), abs=0.0001), row
    _the_report_reads_the_stopped_run_from_its_bucket(aws_env, run_dir.name, shown[1])


def _the_report_reads_the_stopped_run_from_its_bucket(
    aws_env: dict[str, Any], run_id: str, spent: str
) -> None:
    """`dlinfra report` of this aws run (its records in the emulated S3 bucket): STOPPED, the budget's
    verdict and cost as deploy printed them, a lane for the node, opened offline without an error."""
    from browser import chromium, open_page

    page = aws_env["cwd"] / "report.html"
    result = run_cli("report", run_id, "-o", str(page), env=aws_env["env"], cwd=aws_env["cwd"], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    with chromium() as driver:
        opened = open_page(driver, page)
        assert opened.errors == [] and opened.beyond_the_file == [], (opened.console, opened.requests)
        assert opened.js("return document.querySelector('h1 .status').innerText") == "STOPPED"
        assert opened.js("return document.querySelectorAll('svg.timeline .lane').length") == 1
        text = opened.js("return document.body.innerText")
    assert f"${spent} at $" in text and "target aws" in text, text[:2000]


def _instances(ec2: Any) -> set[str]:
    return {i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}


def _keys() -> dict[str, str]:
    return {
        "aws_access_key_id": FAKE_CREDS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": FAKE_CREDS["AWS_SECRET_ACCESS_KEY"],
    }
