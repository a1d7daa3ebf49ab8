"""The account's controller as a real VM booted from its image (`dlinfra image build --flavor
controller`: dlinfra, terraform and the AWS provider, no TensorFlow): its unchanged user-data under
real cloud-init and systemd starts `dlinfra controller run`, which runs terraform inside the VM
against the moto server on this machine (through qemu's NAT), as it would against AWS. The run's
nodes are processes on this machine, as in test_controller.

One boot, to keep the suite's time: the run is handed over while the VM boots, and it stops
itself once idle; that a deploy starts a stopped controller again is test_controller's (processes).

What this stands in for: EC2 itself. The VM is booted when setup starts its instance, and the run's
replacement instance is booted here by the test (`ec2_boots_replacements`): the controller in the
VM creates it through the API, as on AWS, and cannot reach this machine's processes. Slow (the VM
emulates every instruction): run alone with `-m vm`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dlinfra.runs.run import home
from dlinfra.targets.aws.controller import vm_dir
from dlinfra.targets.aws.healing import instance_user_data
from dlinfra.targets.aws.vms import qemu_pid
from dlinfra.targets.local import AttachedNodes
from e2e.conftest import aws_emulation, left_of, release_private_ip_as_aws_does, s3_json, wait_for
from support import IMAGE_CACHE, aws_client, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.terraform, pytest.mark.slow, pytest.mark.vm]
BUCKET = "dlinfra-controlled-vm"
IDLE_MINUTES = 0.5


@dataclass
class Booted:
    """What the EC2 stand-in booted, or why it stopped booting."""

    ids: list[str] = field(default_factory=list)
    failure: BaseException | None = None

    def any(self) -> bool:
        if self.failure is not None:
            raise self.failure
        return bool(self.ids)


@contextlib.contextmanager
def ec2_boots_replacements(endpoint: str, run_id: str, run_dir: Path) -> Iterator[Booted]:
    """Stand-in for EC2 booting a new instance of the run: each one that appears running (with its
    role and index tags) is booted here as a node process from its own user-data, at its old address
    (the run dir's config), as the deploying machine boots emulated instances."""
    ec2 = aws_client(endpoint, "ec2")
    of_run = [{"Name": "tag:dlinfra:run-id", "Values": [run_id]}]
    known = {
        i["InstanceId"]
        for r in ec2.describe_instances(Filters=of_run)["Reservations"]
        for i in r["Instances"]
    }
    manifest = json.loads((run_dir / "manifest.json").read_text())
    nodes = AttachedNodes(run_id, dict(manifest["pids"]), run_dir=run_dir)
    booted = Booted()
    done = threading.Event()

    def boot() -> None:
        while not done.wait(1):
            try:
                found = ec2.describe_instances(Filters=of_run)["Reservations"]
            except Exception:  # the emulator busy for a moment (EC2's API throttles too): look again
                traceback.print_exc()
                continue
            for inst in (i for r in found for i in r["Instances"]):
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                ready = inst["State"]["Name"] == "running" and {"dlinfra:role", "dlinfra:index"} <= set(tags)
                if inst["InstanceId"] in known or not ready:
                    continue  # not yet running, or not yet tagged: looked at again next time
                known.add(inst["InstanceId"])
                name = f"{tags['dlinfra:role']}-{tags['dlinfra:index']}"
                user_data = instance_user_data(ec2, {name: {"id": inst["InstanceId"]}})[name]
                nodes.replace(name, user_data)
                booted.ids.append(inst["InstanceId"])

    def guarded() -> None:
        try:
            boot()
        except BaseException as exc:  # the test fails with it, not with a timeout
            traceback.print_exc()
            booted.failure = exc

    thread = threading.Thread(target=guarded, daemon=True)
    thread.start()
    try:
        yield booted
    finally:
        done.set()
        thread.join()
        nodes.stop(grace=0)


def test_the_controller_vm_from_its_image_heals_a_handed_over_run_tears_it_down_and_stops_when_idle(
    moto_endpoint: str, tf_cli_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "laptop").mkdir()
    aws = aws_emulation(moto_endpoint, tf_cli_config, tmp_path / "laptop", BUCKET, make_bucket=False)
    for key, value in aws["env"].items():  # the stand-in boots nodes here, as the deploying machine
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    env = aws["env"] | {"DLINFRA_IMAGE_CACHE": str(IMAGE_CACHE)}
    s3, ec2 = aws_client(moto_endpoint, "s3"), aws_client(moto_endpoint, "ec2")
    bucket_args = ["--bucket", BUCKET, "--endpoint-url", moto_endpoint]

    def instance_state(instance_id: str) -> str:
        found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        return str(found["State"]["Name"])

    built = run_cli(
        "image", "build", "--target", "local", "--flavor", "controller", env=env, timeout=1800
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    record = json.loads((Path(built.stdout.strip().splitlines()[-1]) / "image.json").read_text())
    assert record["flavor"] == "controller" and record["tensorflow"] is None

    made = run_cli(
        "setup", *bucket_args, "--controller", "--ami", aws["ami"], "--idle-minutes", str(IDLE_MINUTES),
        "--emulate-instances=vm", env=env, cwd=aws["cwd"], timeout=900,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    instance_id = s3_json(s3, BUCKET, "controller/controller.json")["instance_id"]
    # the emulated instance's VM: its console, and its qemu's pid file (DLINFRA_HOME is the laptop's)
    console = aws["home"] / vm_dir(instance_id).relative_to(home()) / "console.log"
    deploying: subprocess.Popen[bytes] | None = None
    try:
        # While the VM boots, a plain deploy (aws.controller: auto, the default where a controller is
        # registered) hands the run over once the nodes are up and follows it as a viewer to its end.
        # One worker: the chief waits for it, so the run cannot end before the replacement trains.
        args = ["--target", "aws", "--workers", "1", "--steps", "2000", "--yes", "--emulate-instances"]
        shown = tmp_path / "deploy.out"
        with open(shown, "w") as out:
            deploying = subprocess.Popen(
                [sys.executable, "-m", "dlinfra", "deploy", *args, *aws["args"]],
                env=env, cwd=aws["cwd"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        runs = aws["home"] / "runs"
        manifest_file = wait_for("the run dir", lambda: next(runs.glob("*/manifest.json"), None), 600)
        laptop_run = manifest_file.parent
        run_id = laptop_run.name
        chief_log = laptop_run / "logs" / "chief-0.log"

        def chief_step() -> int:
            text = chief_log.read_text(errors="replace") if chief_log.exists() else ""  # not started yet
            return int((re.findall(r" step (\d+)/", text) or ["0"])[-1])

        with ec2_boots_replacements(moto_endpoint, run_id, laptop_run) as booted:
            # the worker's instance is lost while the controller VM still boots: nobody acts on it yet
            wait_for("step 200 of the chief", lambda: chief_step() >= 200, 600)
            manifest = json.loads((laptop_run / "manifest.json").read_text())
            worker = manifest["instances"]["worker-0"]
            old = ec2.describe_instances(InstanceIds=[worker])["Reservations"][0]["Instances"][0]
            ec2.terminate_instances(InstanceIds=[worker])
            AttachedNodes(run_id, dict(manifest["pids"])).kill("worker-0")  # the machine is gone
            release_private_ip_as_aws_does(old)
            lost_at = time.monotonic()
            owner = wait_for(
                "the controller VM owning the run",
                lambda: (o := s3_json(s3, BUCKET, f"runs/{run_id}/owner.json")) and not o["handed_to"] and o,
                900,
            )
            owned_at = time.monotonic()
            assert owner["holder"] == f"controller {instance_id}"
            wait_for("the replacement booted", booted.any, 1200)
            replaced_at = time.monotonic()
            wait_for("DONE", lambda: s3_json(s3, BUCKET, f"runs/{run_id}/DONE") is not None, 900)
            assert len(booted.ids) == 1 and booted.failure is None
            assert deploying.wait(timeout=300) == 0, shown.read_text()[-3000:]

        # the deploy followed: it handed over, started the stopped controller, showed the end; the
        # controller VM, not it, healed and tore down
        followed = shown.read_text()
        assert f"run {run_id}: following it here; Ctrl-C stops only this view" in followed
        assert f"run {run_id}: DONE" in followed
        after = followed.split("following it here", 1)[1]
        assert "replaced by" not in after and "stack destroyed" not in after and "apply" not in after

        # nothing more to own: it stops its own instance, and the VM powers off
        wait_for("the idle controller stopped", lambda: instance_state(instance_id) == "stopped", 1200)
        wait_for("the VM powered off", lambda: qemu_pid(console.parent) is None, 300)
        booted_log = console.read_text(errors="replace")
        assert "Cloud-init v." in booted_log and "reboot: Power down" in booted_log, booted_log[-3000:]
        published = s3_json(s3, BUCKET, f"runs/{run_id}/manifest.json")
        assert [h["node"] for h in published["heals"]] == ["worker-0"]
        assert published["status"] == "DONE" and published["destroyed"] is True
        nothing: dict[str, list[str]] = {"instances": [], "vpcs": [], "nat_gateways": [], "eips": []}
        assert left_of(moto_endpoint, run_id) == nothing
        logs = run_cli("controller", "logs", *bucket_args, env=env, cwd=aws["cwd"]).stdout
        assert f"run {run_id}: worker-0: replaced by {booted.ids[0]}" in logs, logs
        assert f"run {run_id}: stack destroyed in " in logs
        assert f"controller {instance_id}: nothing to own for 0.5 min: stopping" in logs

        # figures, not limits (BENCHMARKS.md): every instruction of the VM is emulated
        print(
            f"\n[timing] controller VM: a worker lost at step 200 (the VM booting); the controller owned the "
            f"run {owned_at - lost_at:.0f}s later, its replacement booted {replaced_at - lost_at:.0f}s later"
        )
        gone = run_cli("controller", "destroy", *bucket_args, env=env, cwd=aws["cwd"], timeout=600)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert instance_state(instance_id) == "terminated"
    finally:
        if deploying is not None and deploying.poll() is None:
            deploying.kill()
        if (pid := qemu_pid(console.parent)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        print(console.read_text(errors="replace")[-6000:] if console.exists() else "no console")
