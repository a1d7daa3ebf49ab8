"""An instance's NVMe instance store as the disk its data is staged on (node.instance_store): which
disks qualify, read from a sysfs tree laid out as a g5.xlarge's (a stand-in: this machine has no EC2
NVMe devices), then real formatting and mounting of a real block device (a loop device over a sparse
file: root only, as the node agent of an instance runs)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlinfra.node.instance_store import Disk, instance_disks, mounts, stage_on_instance_store, use_for_data


def _nvme(sys_block: Path, name: str, model: str, sectors: int, partitions: int = 0) -> None:
    dev = sys_block / name
    (dev / "device").mkdir(parents=True)
    (dev / "device" / "model").write_text(f"{model}\n")
    (dev / "size").write_text(f"{sectors}\n")
    for p in range(1, partitions + 1):
        (dev / f"{name}p{p}").mkdir()


def test_the_instance_store_is_every_nvme_disk_that_is_not_ebs_nor_partitioned(tmp_path: Path) -> None:
    """A g5.xlarge as Linux sees it: the root EBS volume (partitioned), a second EBS volume, and the
    250 GB instance store; a qemu NVMe disk (the VMs' stand-in) qualifies as well."""
    sys_block = tmp_path / "block"
    _nvme(sys_block, "nvme0n1", "Amazon Elastic Block Store", 200 * 2**21, partitions=2)
    _nvme(sys_block, "nvme1n1", "Amazon EC2 NVMe Instance Storage", 488_281_250)
    _nvme(sys_block, "nvme2n1", "Amazon Elastic Block Store", 100 * 2**21)
    (sys_block / "vda").mkdir()
    assert instance_disks(sys_block) == [Disk("/dev/nvme1n1", 250 * 10**9)]
    _nvme(sys_block, "nvme3n1", "QEMU NVMe Ctrl", 4 * 2**21)
    assert [d.device for d in instance_disks(sys_block)] == ["/dev/nvme1n1", "/dev/nvme3n1"]
    assert instance_disks(tmp_path / "none") == []


@pytest.fixture
def blank_disk(tmp_path: Path) -> Iterator[Disk]:
    if os.geteuid() != 0:
        pytest.fail("formatting and mounting a device needs root, as the agent of an instance has")
    backing = tmp_path / "store.raw"
    with open(backing, "wb") as blank:
        blank.truncate(64 * 2**20)
    device = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield Disk(device, 64 * 2**20)
    finally:
        for where in [w for d, w in mounts().items() if d == device]:
            subprocess.run(["umount", where], check=False)
        subprocess.run(["losetup", "-d", device], check=False)


def test_a_blank_store_is_formatted_and_mounted_where_staging_writes_and_kept_by_a_restart(
    tmp_path: Path, blank_disk: Disk
) -> None:
    shards = tmp_path / "work" / "worker-0" / "shards"
    line = use_for_data(blank_disk, shards, mounts())
    assert line == (
        f"data staged on the instance store {blank_disk.device} "
        f"(0.1 GiB, formatted ext4, mounted at {shards})"
    )
    assert os.path.ismount(shards) and mounts()[blank_disk.device] == str(shards)
    (shards / "train").mkdir()
    (shards / "train" / "a.tfrecord").write_bytes(b"x" * 1000)
    # the agent restarted: the mount and what it holds stay, nothing is formatted again
    again = stage_on_instance_store(shards)
    assert again is not None and "set up by an earlier life" in again
    assert (shards / "train" / "a.tfrecord").read_bytes() == b"x" * 1000


def test_a_store_the_image_mounted_is_used_where_it_is(tmp_path: Path, blank_disk: Disk) -> None:
    """The Deep Learning AMI mounts its instance store at /opt/dlami/nvme: staging goes there, by a
    link, and nothing on it is formatted."""
    subprocess.run(["mkfs.ext4", "-q", "-F", blank_disk.device], check=True)
    image_mount = tmp_path / "opt-dlami-nvme"
    image_mount.mkdir()
    subprocess.run(["mount", blank_disk.device, str(image_mount)], check=True)
    (image_mount / "theirs").write_text("kept")
    shards = tmp_path / "work" / "worker-1" / "shards"
    line = use_for_data(blank_disk, shards, mounts())
    assert line.endswith(f"mounted at {image_mount} by the image")
    assert shards.is_symlink() and shards.resolve() == image_mount / "dlinfra-shards" / "worker-1"
    (shards / "train").mkdir()
    assert (image_mount / "dlinfra-shards" / "worker-1" / "train").is_dir()
    assert (image_mount / "theirs").read_text() == "kept"
