"""The account's controller as the aws target makes and wakes it: its stack (`dlinfra setup
--controller`: infra/controller, state of its own beside the bucket's), and the start of its stopped
instance when a run is handed over. With --emulate-instances its instance is booted by whoever starts
it (as the run's nodes are by whoever applies them): a local process (`process`), or a VM from the
controller image (`vm`: `dlinfra image build --target local --flavor controller`) that runs terraform
inside against the emulator, as the instance would against AWS."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from dlinfra.errors import DlinfraError, SpecError
from dlinfra.render.cloud_init import render_controller_user_data
from dlinfra.runs.handover import POLL_SECONDS, judge
from dlinfra.runs.layout.controller import ControllerStore
from dlinfra.runs.records import ControllerInfo
from dlinfra.runs.run import home
from dlinfra.runs.sealing import read_key
from dlinfra.spec.catalog import catalog, machine_of
from dlinfra.targets.aws.stack import copy_hcl
from dlinfra.targets.base import Log
from dlinfra.terraform import Terraform

ROOT_VOLUME_GB = 16  # infra/controller's root disk: what a stopped controller costs


def cheapest_type(region: str) -> tuple[str, float]:
    """The catalog's cheapest x86_64 instance type in `region` (the controller image's platform:
    images.terraform_tools), and its $/h."""
    priced = [
        (price, t.name)
        for t in catalog().types
        if (price := t.price(region)) is not None and machine_of(t.name) == "x86_64"
    ]
    if not priced:
        raise SpecError([f"--region {region}: the catalog has no prices there. Fix: use a region it prices"])
    price, name = min(priced)
    return name, price


def baked_ami(region: str, endpoint_url: str | None) -> str:
    """The controller AMI `image build --target aws --flavor controller` baked for this dlinfra."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from dlinfra import __version__
    from dlinfra.targets.aws.images import find_baked

    ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)
    try:
        found = find_baked(ec2, __version__, "controller")
    except (BotoCoreError, ClientError) as exc:
        raise DlinfraError(
            f"--controller: cannot look up the controller image in {region} ({exc}). Fix: check the AWS "
            "credentials and network, or name the image with --ami"
        ) from None
    if found is None:
        raise SpecError(
            [
                f"--controller: no controller image is baked for dlinfra {__version__} in {region}. Fix: "
                f"dlinfra image build --target aws --flavor controller --set aws.region={region} (once per "
                "dlinfra version), or name an image with --ami"
            ]
        )
    return str(found["id"])


def setup(
    bucket: str,
    region: str,
    endpoint_url: str | None,
    ami_id: str,
    idle_minutes: float,
    log: Log,
    emulate: Literal["process", "vm"] | None = None,
) -> str:
    """Apply the controller's stack for `bucket` and register it there; say what it costs."""
    instance_type, usd_per_hour = cheapest_type(region)
    root = home() / "setup" / f"{bucket}-controller"
    if not root.exists():
        copy_hcl("controller", root)
    variables = {
        "region": region,
        "endpoint_url": endpoint_url,
        "bucket": bucket,
        "ami_id": ami_id,
        "instance_type": instance_type,
        "user_data": render_controller_user_data(bucket, region, idle_minutes, endpoint_url),
        "tags": {"dlinfra:purpose": "controller"},
    }
    inputs = root / "controller.tfvars.json"
    inputs.write_text(json.dumps(variables, indent=2))
    tf = Terraform(root / "controller", log=log)
    tf.init()
    tf.plan(inputs, root / "controller.tfplan")
    instance_id = tf.apply(root / "controller.tfplan")["instance_id"]
    read_key(bucket, region, endpoint_url, create=True)  # made here, never by Terraform: no state holds it
    store = ControllerStore.of_bucket(bucket, endpoint_url, region)
    store.put_info(
        ControllerInfo(
            holder=f"controller {instance_id}",
            instance_id=instance_id,
            idle_minutes=idle_minutes,
            beat=time.time(),
            state="stopped",  # until its first look: the next hand-over starts it if it is not up
            emulated=emulate,
        )
    )
    if emulate:
        _boot(store, region, endpoint_url)
    gb_month = catalog().gp3_usd_per_gb_month.get(region)
    disk = f"${ROOT_VOLUME_GB * gb_month:.2f}/month" if gb_month is not None else "unpriced here"
    return (
        f"controller {instance_id} ({instance_type}, ${usd_per_hour:.4f}/h while it runs; stopped, only its "
        f"{ROOT_VOLUME_GB} GiB gp3 disk is billed, {disk}) serves s3://{bucket} (state in {root})"
    )


def wake(store: ControllerStore, region: str, endpoint_url: str | None, log: Log) -> bool:
    """Start the controller's instance if it is stopped (or went silent): a run was just handed over.
    Whether it was started here (then its record says `stopped` until its first look)."""
    info = store.info()
    if info is None or info.instance_id is None or info.running(time.time(), POLL_SECONDS):
        return False
    _ec2(region, endpoint_url).start_instances(InstanceIds=[info.instance_id])
    if info.emulated:
        try:
            _boot(store, region, endpoint_url)
        except DlinfraError as exc:  # the hand-over stands: the run waits for a controller (or a watch)
            log(f"controller {info.instance_id}: its emulated instance did not boot: {exc}")
            return False
    log(
        f"controller {info.instance_id}: started (it was {info.state}); it takes the run up once it "
        "has booted"
    )
    return True


def _boot(store: ControllerStore, region: str, endpoint_url: str | None) -> None:
    """The emulated instance, booted as registered. It outlives this CLI, as the instance would.
    Once per instance: starting a running instance boots nothing, and two would both hold its lease."""
    info = store.info()
    if info is None or info.instance_id is None:
        raise DlinfraError(f"no controller instance is registered in {store.uri()}")
    if info.emulated == "vm":
        _boot_vm(info.instance_id, region, endpoint_url)
        return
    instance_id, idle_minutes = info.instance_id, info.idle_minutes
    bucket = store.uri().removeprefix("s3://").split("/", 1)[0]
    if emulated_pids(instance_id):
        return
    # `dlinfra controller run` as its unit runs it, in a session and a home of its own
    where = home() / "emulated-controller"
    where.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "dlinfra", "controller", "run", "--bucket", bucket, "--region", region]
    argv += ["--idle-minutes", f"{idle_minutes:g}", "--instance-id", instance_id]
    argv += ["--endpoint-url", endpoint_url] if endpoint_url else []
    with open(where / "controller.out", "ab") as out:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, DLINFRA_HOME=str(where)),
            start_new_session=True,
        )


def vm_dir(instance_id: str) -> Path:
    """The controller VM's console, disk and shell socket (`console.log`, `shell.sock`)."""
    return home() / "emulated-controller" / instance_id


def _boot_vm(instance_id: str, region: str, endpoint_url: str | None) -> None:
    from dlinfra.images.local import find
    from dlinfra.runs.wheel import node_wheel
    from dlinfra.targets.aws.healing import instance_user_data
    from dlinfra.targets.aws.vms import boot_instance, qemu_pid

    if qemu_pid(vm_dir(instance_id)) is not None:
        return
    image = find("controller", node_wheel())
    if image is None:
        raise DlinfraError(
            "--emulate-instances=vm: no controller image bakes this dlinfra. "
            "Fix: dlinfra image build --target local --flavor controller"
        )
    ec2 = _ec2(region, endpoint_url)
    user_data = instance_user_data(ec2, {"controller": {"id": instance_id}})["controller"]
    boot_instance(ec2, instance_id, user_data, image, vm_dir(instance_id), region, endpoint_url)


def emulated_pids(instance_id: str) -> list[int]:
    """The processes standing in for the instance here (--emulate-instances)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "controller run" in cmdline and f"--instance-id {instance_id}" in cmdline:
            found.append(int(proc.name))
    return found


def _ec2(region: str, endpoint_url: str | None) -> Any:
    import boto3

    return boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)


def stop(store: ControllerStore, region: str, endpoint_url: str | None) -> str:
    """Stop the controller's instance now. Runs it owns go on; their leases lapse and the next
    `dlinfra watch` (or the controller, started again by a hand-over) takes them."""
    info = store.info()
    if info is None or info.instance_id is None:
        return f"no controller instance serves {store.uri()}"
    _ec2(region, endpoint_url).stop_instances(InstanceIds=[info.instance_id])
    _end_emulated(info.instance_id)
    store.put_info(info.model_copy(update={"state": "stopped", "beat": time.time(), "runs": []}))
    owned = f"; the runs it owned ({', '.join(info.runs)}) wait for their next owner" if info.runs else ""
    return f"controller {info.instance_id}: stopped{owned}"


def destroy(bucket: str, store: ControllerStore, log: Log) -> str:
    """Remove the controller's stack (never while a run is handed to it) and its registration."""
    info = store.info()
    key = lambda: read_key(store.bucket, store.region, store.endpoint_url, create=False)  # noqa: E731
    handed = {h.run_id for h in judge(store, store.listed(), key).sealed}  # planted ones hold nothing
    busy = sorted(handed | set(info.runs if info else []))
    if busy:
        raise SpecError(
            [f"the controller of s3://{bucket} still owns {', '.join(busy)}. Fix: wait for the run(s) to "
             "end (`dlinfra controller status`), or `dlinfra destroy RUN` them first"]
        )  # fmt: skip
    root = home() / "setup" / f"{bucket}-controller"
    if not (root / "controller.tfvars.json").is_file():
        raise SpecError(
            [f"--bucket {bucket}: no controller stack was set up from this machine ({root} is missing). "
             "Fix: run this where `dlinfra setup --controller` ran"]
        )  # fmt: skip
    if info and info.instance_id:
        _end_emulated(info.instance_id)
    Terraform(root / "controller", log=log).destroy(root / "controller.tfvars.json")
    store.remove_info()
    return f"controller of s3://{bucket}: stack destroyed (the bucket and its runs are untouched)"


def _end_emulated(instance_id: str) -> None:
    """An emulated instance stops with its process (or its VM)."""
    from dlinfra.targets.aws.vms import qemu_pid

    vm = qemu_pid(vm_dir(instance_id))
    for pid in emulated_pids(instance_id) + ([vm] if vm is not None else []):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
