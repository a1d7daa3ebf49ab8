"""Real Linux VMs (qemu, under TCG here) boot the aws target's unchanged user-data with real cloud-init
and systemd, against a moto server: `--emulate-instances=vm`. What this stands in for: EC2 machines
(the image is Debian bookworm built here, not the Deep Learning AMI). Everything inside a VM is real:
cloud-init, the install script, the systemd unit and its restart rules, the agent, TensorFlow.

Slow (minutes per test on two emulated cores): run alone with `-m vm`."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from dlinfra.runs.preflight import JUDGED
from e2e.conftest import Deployed, Live, start_deploy
from support import (
    FAKE_CREDS,
    IMAGE_CACHE,
    cgroup_cpu_limit,
    ec2_client,
    run_cli,
    s3_client,
)

pytestmark = [pytest.mark.e2e, pytest.mark.terraform, pytest.mark.slow, pytest.mark.vm]
BUCKET = "dlinfra-vm-results"
SLOW_VM_CPUS = 0.3
# Below the default 0.8: three emulated VMs share two cores, and software emulation moves one VM's
# figure against another's; a VM on a third of a CPU measures about a third of its peers'.
MIN_RATIO = 0.5


@pytest.fixture(scope="module")
def vm_env(
    moto_endpoint: str, tf_cli_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    s3 = s3_client(moto_endpoint)
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    ami = ec2_client(moto_endpoint).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | FAKE_CREDS
    env |= {
        "TF_CLI_CONFIG_FILE": str(tf_cli_config),
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "DLINFRA_IMAGE_CACHE": str(IMAGE_CACHE),
    }
    args = [
        "--target", "aws", "--yes", "--keep", "--emulate-instances=vm",
        "--endpoint-url", moto_endpoint,
        "--set", f"storage.url=s3://{BUCKET}/runs",
        "--set", f"aws.ami={ami}",
        "--set", "cluster.workers.gpus=0",
        # Boots under software emulation take minutes before the first beat, and an agent that
        # systemd restarts spends more than the default 60 s importing Python before it beats
        # again when the emulating host is loaded (CI's shared phase saw it called lost).
        "--set", "cluster.startup_timeout=900",
        "--set", "cluster.heartbeat_timeout=600",
    ]  # fmt: skip
    return {"env": env, "args": args, "endpoint": moto_endpoint}


@pytest.fixture(scope="module")
def baked_image(vm_env: dict[str, Any]) -> Path:
    """`dlinfra image build --target local`: the node image of this checkout's wheel."""
    result = run_cli("image", "build", "--target", "local", env=vm_env["env"], timeout=1800)
    assert result.returncode == 0, result.stderr
    image = Path(result.stdout.strip().splitlines()[-1])
    record = json.loads((image / "image.json").read_text())
    assert record["flavor"] == "cpu" and record["tensorflow"].startswith("tensorflow-cpu 2.21")
    return image


def _instances(endpoint: str, run_id: str) -> dict[str, str]:
    found = ec2_client(endpoint).describe_instances(
        Filters=[{"Name": "tag:dlinfra:run-id", "Values": [run_id]}]
    )
    return {
        next(t["Value"] for t in i["Tags"] if t["Key"] == "Name"): i["State"]["Name"]
        for r in found["Reservations"]
        for i in r["Instances"]
    }


def _wait_for_key(endpoint: str, prefix: str, live: Live, timeout: float = 1800) -> str:
    """The first key under `prefix` in the results bucket, once one is there."""
    s3 = s3_client(endpoint)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert live.proc.poll() is None, live.proc.communicate()
        found = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        if found:
            return found[0]["Key"]
        time.sleep(0.2)
    raise AssertionError(f"nothing under {prefix} in {timeout:.0f}s")


def _s3_text(endpoint: str, key: str) -> str:
    return s3_client(endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()


def _destroy(run_id: str, home: Path, env: dict[str, str]) -> None:
    result = run_cli("destroy", run_id, env=env | {"DLINFRA_HOME": str(home)})
    assert result.returncode == 0, result.stderr


@pytest.mark.exclusive  # with the machine to itself: three emulated VMs need both cores
def test_three_vms_train_from_the_baked_image_and_preflight_names_the_one_given_less_cpu(
    baked_image: Path, vm_env: dict[str, Any], tmp_path: Path
) -> None:
    """3 multi_worker_mirrored workers, each a VM running its own unchanged user-data: the baked
    image skips pip, the nodes train digits, DONE and the model land in moto's S3, every VM powers
    off by itself and its instance ends terminated. worker-1's VM is given a third of a host CPU
    (its qemu process, by the cgroup cpu controller: what a noisy neighbour or a throttled host does,
    unseen from inside) while the nodes measure: quick preflight names it, and only it (by the
    figures the throttle pulled below min_ratio of its peers', which move with the host's load); on_fail:
    warn lets the run train. (A user's own files in S3 taken from the chief's dispatcher, and the
    instance store formatted and mounted, run on emulated instances as processes:
    test_aws_emulated's kept run, tests/test_instance_store.py. Inside these VMs they took about
    300 s of the 590 s from cloud-init done to power-off: BENCHMARKS.md.)"""
    limit = cgroup_cpu_limit()
    preflight = f"cluster.preflight={{checks: quick, on_fail: warn, min_ratio: {MIN_RATIO}}}"
    args = ("--workers", "3", "--strategy", "multi_worker_mirrored", "--steps", "4", "--set", preflight)
    t0 = time.monotonic()
    live = start_deploy(tmp_path, *vm_env["args"], *args, env=vm_env["env"])
    qemu = live.run_dir / "vms" / "worker-1" / "qemu.pid"
    # From the first node's preflight record (the strategy formed, every node near its checks): the
    # all-reduce's warm-up and the wait for every record come before any node measures its device.
    first = _wait_for_key(vm_env["endpoint"], f"runs/{live.run_dir.name}/preflight/1/", live)
    with limit(int(qemu.read_text()), SLOW_VM_CPUS):
        verdict = _wait_for_key(
            vm_env["endpoint"], f"runs/{live.run_dir.name}/preflight/1/verdict.json", live
        )
    done = live.finish(timeout=1800)
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = Deployed(done, live.home, live.run_dir)
    manifest = run.manifest
    run_id = manifest["run_id"]
    try:
        said = json.loads(_s3_text(vm_env["endpoint"], verdict))
        assert said["action"] == "warn" and {f["node"] for f in said["flagged"]} == {"worker-1"}, said
        # whichever figures the throttle pulled down, which moves with the host's load (2026-11-28):
        # beside other tests only worker-1's links (0.42 of its peers'; its emulated NIC is its qemu
        # process's work too), the machine to itself its gemm (0.32) and conv (0.37)
        flags = said["flagged"]
        assert all(f["against"] == "peers" and f["ratio"] < MIN_RATIO for f in flags), flags
        assert first.startswith(f"runs/{run_id}/preflight/1/")
        said_out = " ".join((done.stdout + done.stderr).split())  # as said, however the lines wrapped
        assert all(f"worker-1: {JUDGED[f['figure']][0]}" in said_out for f in flags), said_out[-3000:]
        assert manifest["status"] == "DONE"
        assert {pin["id"] for pin in manifest["images"].values()} == {baked_image.name}
        s3 = s3_client(vm_env["endpoint"])
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{run_id}/")["Contents"]}
        assert f"runs/{run_id}/DONE" in keys
        assert any("/model/" in k for k in keys), sorted(keys)
        for node in ("worker-0", "worker-1", "worker-2"):
            console = (run.run_dir / "vms" / node / "console.log").read_text(errors="replace")
            # real cloud-init ran the user-data: the install script found the baked environment
            assert re.search(
                r"dlinfra: the image \([0-9a-f]{12}\) bakes this run's dlinfra and lock: no install", console
            )
            assert "reboot: Power down" in console, f"{node} did not power off by itself"
            assert f"{node}: the VM powered off; instance" in run.result.stdout
        assert set(_instances(vm_env["endpoint"], run_id).values()) == {"terminated"}
        shown = run_cli(
            "logs",
            run_id,
            "--node",
            "worker-0",
            "--console",
            env=vm_env["env"] | {"DLINFRA_HOME": str(run.home)},
        )
        assert "Cloud-init v." in shown.stdout
        # a figure, not a limit (BENCHMARKS.md): this machine is shared and emulates every instruction
        print(f"\n[timing] 3-VM run, deploy to DONE: {wall:.0f}s")
        print("[preflight] worker-1 flagged: " + ", ".join(f"{f['figure']} {f['ratio']:.2f}" for f in flags))
    finally:
        _destroy(run_id, run.home, vm_env["env"])
