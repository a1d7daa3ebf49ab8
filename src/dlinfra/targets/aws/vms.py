"""`--emulate-instances=vm`: every instance Terraform created in the emulator boots as a qemu VM
from a local image, with its own user-data read back through the EC2 API, byte for byte what EC2
would run. What EC2 itself supplies comes as cloud-init vendor-data, cloud-init's mechanism for a
platform's part: credentials (an emulator takes any) and the endpoint, reached through qemu's NAT.

A VM that powers off is terminated in the emulator, as `instance_initiated_shutdown_behavior =
terminate` does on EC2; consoles stay in the run dir (`dlinfra logs RUN --node X --console`)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dlinfra.errors import DlinfraError
from dlinfra.images import images_home
from dlinfra.images.local import LocalImage, find, missing_tools
from dlinfra.images.vm import Seed, Segment, Vm, host_address, nat_network
from dlinfra.runs.run import Run
from dlinfra.spec.catalog import catalog
from dlinfra.spec.model import Spec
from dlinfra.targets.base import Log

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
STAND_IN_STORE_GIB = 2
POWER_OFF_GRACE = 180.0  # an emulated shutdown takes tens of seconds under TCG


def preflight_problems(spec: Spec) -> list[str]:
    problems = []
    if missing := missing_tools():
        problems.append(
            f"--emulate-instances=vm needs {', '.join(missing)}. Fix: apt-get install -y {' '.join(missing)}"
        )
    if spec.cluster.workers.gpus not in (0, "auto"):
        problems.append("--emulate-instances=vm: VMs have no GPUs. Fix: --set cluster.workers.gpus=0")
    return problems


def node_image(choice: str, wheel: Path | None, lock_sha256: str | None, log: Log) -> LocalImage:
    """The local image VMs boot, as `aws.image` chooses an AMI: `baked` one baked with this run's
    wheel (with this run's lock if one is: else nodes install the lock's difference at boot); `base`
    the stand-in for a cloud base image (nodes install at boot); `auto` a baked one, else the newest
    baked for another wheel (nodes install their lock's difference and this run's dlinfra), else the
    base image."""
    build = "dlinfra image build --target local"
    if choice != "base" and (baked := find("cpu", wheel, lock_sha256)) is not None:
        record = baked.record
        if record is not None and record.lock_sha256 != lock_sha256:
            log(f"VMs boot {baked.dir.name}, baked with another lock: nodes install the difference at boot")
        return baked
    if choice == "baked":
        raise DlinfraError(f"aws.image: baked, and no local image bakes this dlinfra. Fix: {build}")
    others = sorted(images_home().glob("cpu-*/rootfs.img"), key=lambda p: p.stat().st_mtime)
    if choice == "auto" and others:
        image = LocalImage(others[-1].parent)
        log(f"VMs boot {image.dir.name}, baked for another dlinfra wheel: nodes install this run's at boot")
        return image
    base = find("base", None)
    if base is None:
        raise DlinfraError(
            f"--emulate-instances=vm: no local image to boot. Fix: {build} "
            f"(or {build} --flavor base for nodes that install at boot); a few minutes, once"
        )
    log(f"VMs boot the base image {base.dir.name}: nodes install dlinfra and TensorFlow at boot")
    return base


def vendor_data(region: str, endpoint_url: str | None, nat_host: str) -> str:
    """The emulated platform's part of a boot: a shell script cloud-init runs before the user's
    commands. Credentials are the emulator's placeholders, never the deploying machine's."""
    endpoint = endpoint_url or ""
    parts = urlsplit(endpoint)
    lines = [
        "#!/bin/sh",
        "# dlinfra's VM emulation of EC2: what the platform supplies (IAM role, endpoint), not the user.",
        "set -eu",
        "mkdir -p /root/.aws",
        f"printf '[default]\\nregion = {region}\\nendpoint_url = {endpoint}\\n' > /root/.aws/config",
        "printf '[default]\\naws_access_key_id = emulator\\naws_secret_access_key = emulator\\n' "
        "> /root/.aws/credentials",
        "chmod 600 /root/.aws/credentials",
    ]
    if parts.hostname in LOOPBACK_HOSTS:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        # The endpoint is the host's loopback, the address node.json names: carry the guest's own
        # loopback port there, through qemu's NAT.
        lines += [
            f"printf '[Socket]\\nListenStream=127.0.0.1:{port}\\n' "
            "> /etc/systemd/system/dlinfra-emulator.socket",
            "printf '[Service]\\nExecStart=/lib/systemd/systemd-socket-proxyd "
            f"{nat_host}:{port}\\n' > /etc/systemd/system/dlinfra-emulator.service",
            "systemctl daemon-reload",
            "systemctl start dlinfra-emulator.socket",
        ]
    return "\n".join(lines) + "\n"


def qemu_pid(vm_dir: Path) -> int | None:
    """The qemu process of the VM whose dir this is, while it runs (its pid file names it)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((vm_dir / "qemu.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if (
            b"qemu-system" in cmdline
            and str(vm_dir).encode() in Path(f"/proc/{pid}/cwd").resolve().as_posix().encode()
        ):
            return pid
    return None


def stop_leftover_vms(run: Run) -> None:
    """Kill the qemu processes of a run's VMs that are still up."""
    for pidfile in (run.dir / "vms").glob("*/qemu.pid"):
        if (pid := qemu_pid(pidfile.parent)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def boot_instance(
    ec2: Any,
    instance_id: str,
    user_data: str,
    image: LocalImage,
    vm_dir: Path,
    region: str,
    endpoint: str | None,
) -> None:
    """One instance of the emulator as a VM that outlives this process (as the instance outlives
    whoever started it): its user-data and private IP as EC2 holds them. A fresh disk each boot:
    whatever runs there must keep nothing that matters on it."""
    found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    subnet = ec2.describe_subnets(SubnetIds=[found["SubnetId"]])["Subnets"][0]["CidrBlock"]
    name = next((t["Value"] for t in found.get("Tags", []) if t["Key"] == "Name"), instance_id)
    nat = nat_network(subnet)
    seed = Seed(
        instance_id,
        name,
        user_data,
        vendor_data(region, endpoint, host_address(nat)),
        found["PrivateIpAddress"],
    )
    Vm(name, image, seed, Segment.for_run(instance_id, subnet), vm_dir, nat).start()


@dataclass
class VmCluster:
    """The run's instances as VMs. `instances` is the watcher's own node → instance id map: a
    healed node's new VM boots as its new instance."""

    spec: Spec
    run: Run
    image: LocalImage
    ec2: Any
    instances: dict[str, str]
    log: Log
    vms: dict[str, Vm] = field(default_factory=dict)
    private_ips: dict[str, str] = field(default_factory=dict)
    terminated: set[str] = field(default_factory=set)

    def start(self, user_data: dict[str, str], private_ips: dict[str, str]) -> None:
        self.private_ips.update(private_ips)
        nat = nat_network(self.spec.aws.vpc_cidr)
        segment = Segment.for_run(self.run.id, self.spec.aws.subnet_cidr)
        vendor = vendor_data(self.spec.aws.region, self.spec.aws.endpoint_url, host_address(nat))
        for name in sorted(user_data, key=lambda n: n.startswith("chief")):
            seed = Seed(self.instances[name], name, user_data[name], vendor, self.private_ips[name])
            vm = Vm(name, self.image, seed, segment, self.run.vm_dir(name), nat, self._store_gib(name))
            vm.start()
            self.vms[name] = vm
            self.terminated.discard(self.instances[name])
        where = self.run.dir / "vms"
        self.log(f"booted {len(user_data)} VMs from {self.image.dir.name} (consoles in {where})")

    def exit_codes(self) -> dict[str, int | None]:
        return {name: vm.poll() for name, vm in self.vms.items()}

    def _store_gib(self, name: str) -> int:
        """The stand-in for the node's instance store: a few GiB where its type has one (this
        machine's disk holds every VM's)."""
        kind = catalog().get(self.spec.roles()[name.rsplit("-", 1)[0]].instance_type)
        return STAND_IN_STORE_GIB if kind is not None and kind.instance_store_gb else 0

    def poll(self, why: str = "the VM powered off") -> dict[str, int | None]:
        codes = self.exit_codes()
        for name, code in codes.items():
            instance = self.instances[name]
            if code is not None and instance not in self.terminated:
                self.ec2.terminate_instances(InstanceIds=[instance])
                self.terminated.add(instance)
                self.log(f"{name}: {why}; instance {instance} terminated")
        return codes

    def kill(self, name: str) -> None:
        if name in self.vms:
            self.vms[name].kill()

    def replace(self, name: str, user_data: str) -> None:
        self.kill(name)
        self.start({name: user_data}, {})

    def stop(self, grace: float = POWER_OFF_GRACE) -> None:
        """Once a run has ended, its agents see the marker and their VMs power off by themselves (as
        instances do); what is still up after `grace` seconds is stopped."""
        deadline = time.monotonic() + grace
        while any(code is None for code in self.poll().values()) and time.monotonic() < deadline:
            time.sleep(1)
        for vm in self.vms.values():
            vm.stop()
        self.poll("the VM was stopped")
