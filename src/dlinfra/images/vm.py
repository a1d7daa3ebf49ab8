"""One qemu VM booted from a local image, with cloud-init's NoCloud seed: the user-data exactly as a
cloud would hand it over, the vendor-data of the emulated platform, and a network-config that puts
the VM on two networks:

    nic 0  qemu user networking (NAT): the host's loopback is reachable at the network's .2 address
    nic 1  a private L2 segment shared with the run's other VMs (a multicast socket on the host's
           loopback), carrying the instance's private IP: the VPC subnet, emulated

The serial console goes to console.log; a second serial port is a root shell bound to a unix
socket next to it (like EC2's serial console: for people and tests, never reachable on a network).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dlinfra.environment.lock import Platform
from dlinfra.images.local import LocalImage

MEMORY_MB = 2048  # TensorFlow's import alone takes ~0.7 GB
# One emulated vCPU per VM: three VMs of two vCPUs each on two host cores spend their time in guest
# spinlocks and TensorFlow's spinning pools (measured, BENCHMARKS.md: the 3-VM run powers off at
# 422 s instead of 614 s). The agent gives a one-CPU node two inter-op threads (node/devices.py).
VCPUS = 1
# Debian 12's Python and glibc: what the local images (and the VMs booting them) run
VM_PLATFORM = Platform("3.11", "x86_64", glibc="2.36")
NAT_CANDIDATES = ("10.0.2.0/24", "192.168.76.0/24", "172.31.254.0/24")


def kvm_usable() -> bool:
    """Whether qemu can use /dev/kvm here. Some hosts expose a paravirtual /dev/kvm (PVM) that
    stock guest kernels cannot run under: only a real boot tells, so it is asked for explicitly."""
    return os.environ.get("DLINFRA_VM_ACCEL") == "kvm" and os.access("/dev/kvm", os.R_OK | os.W_OK)


def nat_network(avoid: str) -> ipaddress.IPv4Network:
    """qemu's NAT network, chosen so it never overlaps the emulated VPC."""
    vpc = ipaddress.IPv4Network(avoid)
    for candidate in map(ipaddress.IPv4Network, NAT_CANDIDATES):
        if not candidate.overlaps(vpc):
            return candidate
    raise ValueError(f"no NAT network outside {avoid}")


def host_address(nat: ipaddress.IPv4Network) -> str:
    """Where a guest reaches the host's loopback through qemu's NAT."""
    return str(nat[2])


@dataclass(frozen=True)
class Segment:
    """A private L2 network for a run's VMs: a multicast group on the host's loopback."""

    group: str
    port: int
    cidr: str

    @classmethod
    def for_run(cls, run_id: str, cidr: str) -> Segment:
        h = int.from_bytes(run_id.encode()[-8:].ljust(8, b"\0"), "big")
        # One group and port per run: two runs' VMs never share a segment.
        return cls(f"239.255.{(h >> 8) % 250 + 1}.{h % 250 + 1}", 20000 + (h >> 16) % 40000, cidr)


@dataclass(frozen=True)
class Seed:
    instance_id: str
    hostname: str
    user_data: str
    vendor_data: str
    private_ip: str


def _mac(nic: int, private_ip: str) -> str:
    """qemu's locally administered prefix, the NIC, and the private IP's last two octets: unique
    within a run (one subnet) and stable across a replaced instance."""
    _, _, o3, o4 = ipaddress.IPv4Address(private_ip).packed
    return f"52:54:00:{nic:02x}:{o3:02x}:{o4:02x}"


@dataclass
class Vm:
    name: str
    image: LocalImage
    seed: Seed
    segment: Segment
    dir: Path
    nat: ipaddress.IPv4Network
    # An instance type's NVMe instance store, stood in for by a blank sparse disk of this size on
    # qemu's NVMe controller (0: the type has none). The guest sees the model "QEMU NVMe Ctrl", not
    # EC2's, which node.instance_store accepts as it accepts any NVMe disk that is not EBS.
    store_gib: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def console(self) -> Path:
        return self.dir / "console.log"

    @property
    def shell_socket(self) -> Path:
        return self.dir / "shell.sock"

    def _write_seed(self) -> Path:
        seed_dir = self.dir / "seed"
        seed_dir.mkdir(parents=True, exist_ok=True)
        net = ipaddress.IPv4Network(self.segment.cidr)
        files = {
            "user-data": self.seed.user_data,
            "vendor-data": self.seed.vendor_data,
            "meta-data": f"instance-id: {self.seed.instance_id}\nlocal-hostname: {self.seed.hostname}\n",
            "network-config": (
                "version: 2\n"
                "ethernets:\n"
                "  nat:\n"
                f'    match: {{macaddress: "{self._nat_mac}"}}\n'
                "    set-name: eth0\n"
                f"    addresses: [{self.nat[15]}/{self.nat.prefixlen}]\n"
                f"    gateway4: {self.nat[2]}\n"
                "  vpc:\n"
                f'    match: {{macaddress: "{self._vpc_mac}"}}\n'
                "    set-name: eth1\n"
                f"    addresses: [{self.seed.private_ip}/{net.prefixlen}]\n"
            ),
        }
        for name, text in files.items():
            (seed_dir / name).write_text(text, encoding="utf-8")
        iso = self.dir / "seed.iso"
        subprocess.run(
            ["genisoimage", "-quiet", "-output", str(iso), "-volid", "cidata", "-joliet", "-rock", *files],
            cwd=seed_dir,
            check=True,
            capture_output=True,
        )
        return iso

    @property
    def _nat_mac(self) -> str:
        return _mac(0, self.seed.private_ip)

    @property
    def _vpc_mac(self) -> str:
        return _mac(1, self.seed.private_ip)

    def _store_args(self) -> list[str]:
        if not self.store_gib:
            return []
        store = self.dir / "instance-store.raw"
        store.unlink(missing_ok=True)  # a replaced instance's store comes up blank, as on EC2
        with open(store, "wb") as blank:
            blank.truncate(self.store_gib * 2**30)
        return [
            "-drive", f"file={store},if=none,id=store,format=raw,cache=unsafe",
            "-device", "nvme,serial=dlinfra-instance-store,drive=store",
        ]  # fmt: skip

    def command(self, iso: Path, disk: Path) -> list[str]:
        # qemu's own default translation cache (1 GiB), not 256 MiB, which terraform's provider,
        # Python and TensorFlow outgrow (each flush translates their code again). Measured: terraform
        # and an import in the controller image 442 -> 397 CPU-s; the three-VM test 1694 -> 1290
        tcg = ["-accel", "tcg,tb-size=1024", "-cpu", self._tcg_cpu()]
        accel = ["-accel", "kvm", "-cpu", "host"] if kvm_usable() else tcg
        seg = self.segment
        return [
            "qemu-system-x86_64",
            *accel,
            "-m", str(MEMORY_MB), "-smp", str(VCPUS),
            "-nodefaults", "-no-user-config", "-nographic", "-monitor", "none",
            "-name", self.name, "-pidfile", "qemu.pid",
            "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
            "-append", "root=/dev/vda rw console=ttyS0 quiet",  # quiet: every console byte is emulated I/O
            "-drive", f"file={disk},if=virtio,format=qcow2,cache=unsafe",
            "-drive", f"file={iso},if=virtio,format=raw,readonly=on",
            *self._store_args(),
            "-device", "virtio-rng-pci",
            "-chardev", "file,id=console,path=console.log",
            "-serial", "chardev:console",
            "-chardev", "socket,id=shell,path=shell.sock,server=on,wait=off",
            "-serial", "chardev:shell",
            "-netdev", f"user,id=nat,net={self.nat},restrict=off",
            "-device", f"virtio-net-pci,netdev=nat,mac={self._nat_mac}",
            "-netdev", f"socket,id=vpc,mcast={seg.group}:{seg.port},localaddr=127.0.0.1",
            "-device", f"virtio-net-pci,netdev=vpc,mac={self._vpc_mac}",
        ]  # fmt: skip

    def _tcg_cpu(self) -> str:
        """TensorFlow's wheels need AVX: nodes get every feature qemu emulates. The controller's
        image has no TensorFlow, and plain SSE code (Go's sha256 of the provider at every terraform
        command, glibc's string functions) runs faster under emulation than the AVX2 that `max`
        makes it pick. Measured, two VMs side by side on the controller image: `terraform init`,
        `validate`, `plan` and an import, power-on to off, 544 -> 452 CPU-s."""
        record = self.image.record
        return "Nehalem" if record is not None and record.flavor == "controller" else "max"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        disk = self.dir / "disk.qcow2"
        disk.unlink(missing_ok=True)
        self.shell_socket.unlink(missing_ok=True)
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.image.rootfs), "-F", "raw", str(disk)],
            check=True,
            capture_output=True,
        )
        iso = self._write_seed()
        with open(self.dir / "qemu.log", "ab") as log:
            # cwd: the sockets' and console's paths stay short (unix sockets allow 108 bytes)
            self.process = subprocess.Popen(
                self.command(iso, disk),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def poll(self) -> int | None:
        """None while the VM runs; qemu's exit code once the guest powered off (0) or qemu failed."""
        return self.process.poll() if self.process else 0

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, grace: float = 5.0) -> None:
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
        (self.dir / "disk.qcow2").unlink(missing_ok=True)  # the instance's disk dies with it


def shell(sock: Path, command: str, timeout: float = 120.0) -> str:
    """Run one command in a VM's root shell on its second serial port; its output (a test's and an
    operator's way in, like EC2's serial console)."""
    tag = f"dlinfra{time.monotonic_ns()}"
    begin, end = f"{tag}-begin", f"{tag}-end"
    # A tty echoes the command line, and twice when it arrives while the shell is busy (the kernel
    # echoes typeahead, then readline redraws it). The markers are printed from two parts, so only
    # the command's output ever holds them whole.
    line = f"\nprintf '%s-begin\\n' {tag}; {command}; printf '%s-end\\n' {tag}\n"
    deadline = time.monotonic() + timeout
    # unix socket paths are capped at 108 bytes; a run dir is often longer: go through a short link
    short = Path(tempfile.mkdtemp(prefix="vm-")) / "s"
    short.symlink_to(sock)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(short))
        shutil.rmtree(short.parent)
        buf = b""
        s.sendall(line.encode())
        while end.encode() not in buf:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer from the VM's shell in {timeout:.0f}s: {buf[-500:]!r}")
            with contextlib.suppress(TimeoutError):
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError(f"the VM's shell closed: {buf[-500:]!r}")
                buf += chunk
    text = buf.decode(errors="replace")
    return text.split(begin, 1)[-1].split(end, 1)[0].strip()
