"""`dlinfra image build --target local`, for real: Debian from mmdebstrap once, then the `base` image
and the `cpu` image (this checkout's wheel and TensorFlow baked in a copy's chroot). Each disk is read
back with e2fsprogs, not trusted from the build's own log.

In CI this runs beside the other tests (scripts/test.sh, first phase); the VM tests then boot these
very images from the same cache."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from dlinfra.images import IMAGE_JSON_PATH, IMAGE_LOCK_PATH, VENV
from dlinfra.runs.wheel import node_wheel
from support import IMAGE_CACHE, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.images, pytest.mark.full]


def _build(*flags: str) -> tuple[Path, str]:
    env = dict(os.environ, DLINFRA_IMAGE_CACHE=str(IMAGE_CACHE))
    result = run_cli("image", "build", "--target", "local", *flags, env=env, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.stdout.strip().splitlines()[-1]), result.stderr


def _debugfs(disk: Path, request: str) -> subprocess.CompletedProcess[str]:
    """Ask debugfs about an ext4 image (no mount, no VM)."""
    return subprocess.run(["debugfs", "-R", request, str(disk)], capture_output=True, text=True, check=True)


def _read(disk: Path, path: str) -> str:
    return _debugfs(disk, f"cat {path}").stdout


def _exists(disk: Path, path: str) -> bool:
    return "Inode:" in _debugfs(disk, f"stat {path}").stdout


def test_base_and_cpu_images_share_one_debian_and_only_the_cpu_one_bakes_this_wheel() -> None:
    base, _ = _build("--flavor", "base")
    cpu, cpu_log = _build()
    assert "mmdebstrap" not in cpu_log, "the cpu image reuses the Debian tree the base image was made from"
    for image in (base, cpu):
        fsck = subprocess.run(["e2fsck", "-fn", str(image / "rootfs.img")], capture_output=True, text=True)
        assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    for boot in ("vmlinuz", "initrd.img"):  # one Debian tree's kernel and initramfs
        assert (base / boot).read_bytes() == (cpu / boot).read_bytes()

    # base: what a cloud's base image is here (cloud-init, an AWS CLI), and no node environment
    assert _exists(base / "rootfs.img", "/usr/local/bin/aws")
    assert not _exists(base / "rootfs.img", IMAGE_JSON_PATH)
    assert not _exists(base / "rootfs.img", f"{VENV}/bin/dlinfra")
    assert not (base / "image.json").exists()

    # cpu: this checkout's wheel and TensorFlow in the venv, and the record the boot script reads
    wheel = node_wheel()
    assert wheel is not None
    record = json.loads(_read(cpu / "rootfs.img", IMAGE_JSON_PATH))
    assert record == json.loads((cpu / "image.json").read_text())
    assert record["flavor"] == "cpu" and record["tensorflow"].startswith("tensorflow-cpu 2.")
    assert record["wheel_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    # the lock it was baked from, kept: a node of a run on that lock needs no copy from the store
    kept = _read(cpu / "rootfs.img", IMAGE_LOCK_PATH)
    assert hashlib.sha256(kept.encode()).hexdigest() == record["lock_sha256"]
    assert _exists(cpu / "rootfs.img", f"{VENV}/bin/dlinfra")
    assert not _exists(cpu / "rootfs.img", "/tmp/dlinfra-build"), "the build's staging is not shipped"

    again, again_log = _build()
    assert again == cpu and "cached" in again_log
