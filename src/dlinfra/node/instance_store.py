"""The NVMe instance store of the node's own machine (g5, p4d, i4i… carry one: the catalog knows its
size) as the disk its data is staged on, instead of the root volume.

EC2 presents every NVMe device alike to the kernel; an instance-store device is one whose model is
not EBS's. A device this machine's image already mounted (the Deep Learning AMI mounts its store at
/opt/dlami/nvme) is used where it is mounted; an unmounted one is mounted at the staging directory,
formatted first when it holds no filesystem (an instance store comes up blank, and lives only as long
as the instance). Only the agent of an instance (its systemd unit sets DLINFRA_OWN_MACHINE=1) ever
does this: local and emulated nodes share a machine whose disks are not theirs.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

EBS_MODEL = "Amazon Elastic Block Store"
OWN_MACHINE_ENV = "DLINFRA_OWN_MACHINE"  # set by the node's systemd unit (the rendered user-data)


@dataclass(frozen=True)
class Disk:
    device: str  # /dev/nvme1n1
    bytes: int


def instance_disks(sys_block: Path = Path("/sys/block")) -> list[Disk]:
    """NVMe namespaces that are not EBS volumes and hold no partition (a partitioned disk is a
    root or data volume someone laid out), by name."""
    found = []
    for dev in sorted(sys_block.glob("nvme*n*")):
        model_file = dev / "device" / "model"
        model = model_file.read_text().strip() if model_file.is_file() else ""
        partitioned = any(part.name.startswith(f"{dev.name}p") for part in dev.iterdir())
        if model == EBS_MODEL or partitioned:
            continue
        found.append(Disk(f"/dev/{dev.name}", int((dev / "size").read_text()) * 512))  # 512-byte sectors
    return found


def mounts(proc_mounts: Path = Path("/proc/mounts")) -> dict[str, str]:
    """device → where it is mounted (the first place)."""
    found: dict[str, str] = {}
    for line in proc_mounts.read_text().splitlines():
        device, where, *_ = line.split()
        found.setdefault(device, where.replace("\\040", " "))
    return found


def _filesystem(device: str) -> str:
    probe = subprocess.run(["blkid", "-o", "value", "-s", "TYPE", device], capture_output=True, text=True)
    return probe.stdout.strip()  # blkid exits 2, printing nothing, on a blank device


def use_for_data(disk: Disk, target: Path, mounted: dict[str, str]) -> str:
    """Make `target` (the node's staging directory) live on `disk`; returns what was done."""
    size = f"{disk.bytes / 2**30:.1f} GiB"
    if where := mounted.get(disk.device):
        # the image mounted it: our directory on it, linked where staging looks
        on_disk = Path(where) / "dlinfra-shards" / target.parent.name
        on_disk.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or not target.exists():
            target.unlink(missing_ok=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(on_disk, target_is_directory=True)
        return f"data staged on the instance store {disk.device} ({size}), mounted at {where} by the image"
    formatted = ""
    if not _filesystem(disk.device):
        # -m 0: no blocks reserved for root on a data disk; nodiscard: a fresh store is blank already
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", disk.device], check=True)
        formatted = "formatted ext4, "
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-o", "noatime", disk.device, str(target)], check=True)
    return f"data staged on the instance store {disk.device} ({size}, {formatted}mounted at {target})"


def stage_on_instance_store(target: Path) -> str | None:
    """The first instance-store disk of this machine under `target`, or None (no such disk: the root
    volume holds the data). An earlier life of the agent's mount is kept."""
    if os.path.ismount(target) or target.is_symlink():
        return f"data staged on the instance store at {target} (set up by an earlier life of this node)"
    disks = instance_disks()
    if not disks:
        return None
    return use_for_data(disks[0], target, mounts())
