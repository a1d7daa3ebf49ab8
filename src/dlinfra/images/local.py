"""Local node images: Debian bookworm from mmdebstrap (made once, shared by every flavor), the node
recipe run in a copy's chroot, turned into what qemu boots directly (kernel, initrd, an ext4 root
disk). Cached by digest under images_home(); `--emulate-instances=vm` boots instances from them.

A `base` image has no node environment (the stand-in for a cloud base image: nodes install at
boot); a `cpu` or `gpu` image has the recipe baked in."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dlinfra.environment.lock import Lock
from dlinfra.errors import DlinfraError
from dlinfra.images import IMAGE_JSON_PATH, ImageRecord, Recipe, images_home, terraform_tools
from dlinfra.images.wheelhouse import wheelhouse
from dlinfra.runs.bundle import file_sha256
from dlinfra.runs.manifest import ImagePin

Log = Callable[[str], None]
LocalFlavor = Literal["base", "cpu", "gpu", "controller"]
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
PACKAGES = (
    "systemd-sysv,udev,dbus,cloud-init,python3,python3-venv,ca-certificates,netbase,iproute2,"
    "ifupdown,isc-dhcp-client,curl,kmod,procps,linux-image-cloud-amd64,initramfs-tools,e2fsprogs"
)
TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "mke2fs": "e2fsprogs",
    "unshare": "util-linux",
    "qemu-system-x86_64": "qemu-system-x86",
}
SETUP = Path(__file__).parent / "templates" / "local-setup.sh"
HEADROOM_GB = 3  # free space on the root disk: a node that installs at boot unpacks TensorFlow there


@dataclass(frozen=True)
class LocalImage:
    dir: Path

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs.img"

    @property
    def record(self) -> ImageRecord | None:
        path = self.dir / "image.json"
        return ImageRecord.model_validate_json(path.read_text()) if path.is_file() else None

    def pin(self) -> ImagePin:
        record = self.record
        if record is None:
            return ImagePin(id=self.dir.name)
        return ImagePin(id=self.dir.name, digest=record.recipe_digest, dlinfra_version=record.dlinfra_version)


def missing_tools() -> list[str]:
    return [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]


def _check_host() -> None:
    if missing := missing_tools():
        raise DlinfraError(
            f"local images need {', '.join(missing)}. Fix: apt-get install -y {' '.join(missing)}"
        )
    if os.geteuid() != 0:
        raise DlinfraError("local images are built as root (mmdebstrap, chroot). Fix: run it with sudo")


def _bootstrap_key() -> str:
    return hashlib.sha256((SETUP.read_text() + PACKAGES + "\n".join(MIRRORS)).encode()).hexdigest()[:16]


def image_key(flavor: LocalFlavor, recipe: Recipe | None) -> str:
    h = hashlib.sha256(_bootstrap_key().encode())
    if recipe is not None:
        h.update(recipe.digest.encode())
    return f"{flavor}-{h.hexdigest()[:16]}"


def _planned(flavor: LocalFlavor, wheel: Path | None, lock: Lock | None) -> tuple[LocalImage, Recipe | None]:
    """Where the image of `flavor` (and this wheel and lock) lives, built or not, and its recipe."""
    recipe = None
    if flavor != "base" and wheel is not None and lock is not None:
        recipe = Recipe(flavor, wheel, lock, terraform_tools.digest() if flavor == "controller" else None)
    return LocalImage(images_home() / image_key(flavor, recipe)), recipe


def find(flavor: LocalFlavor, wheel: Path | None, lock_sha256: str | None = None) -> LocalImage | None:
    """The newest built image of `flavor` that bakes this wheel (`base`: the one without a node
    environment), preferring one that holds exactly `lock_sha256`."""
    if flavor == "base":
        image, _ = _planned("base", None, None)
        return image if image.rootfs.is_file() else None
    wheel_sha256 = file_sha256(wheel) if wheel is not None else None
    found = [
        LocalImage(disk.parent)
        for disk in sorted(images_home().glob(f"{flavor}-*/rootfs.img"), key=lambda p: p.stat().st_mtime)
    ]
    found = [i for i in found if (r := i.record) is not None and r.wheel_sha256 == wheel_sha256]
    exact = [i for i in found if i.record is not None and i.record.lock_sha256 == lock_sha256]
    candidates = exact or found
    return candidates[-1] if candidates else None


def build(flavor: LocalFlavor, wheel: Path | None, lock: Lock | None, log: Log) -> LocalImage:
    """The image for `flavor` (and this wheel and lock), from the cache or built now (minutes)."""
    if flavor != "base" and (wheel is None or lock is None):
        raise DlinfraError(
            "a node image bakes a dlinfra wheel, and this dlinfra is not a source checkout. "
            "Fix: run `dlinfra image build` from a checkout of dlinfra"
        )
    image, recipe = _planned(flavor, wheel, lock)
    if image.rootfs.is_file():
        log(f"image {image.dir.name}: cached at {image.dir}")
        return image
    _check_host()
    with _cache_lock(log):
        if image.rootfs.is_file():  # another build made it while this one waited
            log(f"image {image.dir.name}: built meanwhile, at {image.dir}")
            return image
        return _build(image, recipe, log)


@contextlib.contextmanager
def _cache_lock(log: Log) -> Iterator[None]:
    """One build at a time per cache: two would bootstrap Debian twice, and one could replace the
    Debian tree while the other copies it."""
    images_home().mkdir(parents=True, exist_ok=True)
    with open(images_home() / ".build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another image build in {images_home()}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # the lock ends with the file's close, also when the process dies


def _build(image: LocalImage, recipe: Recipe | None, log: Log) -> LocalImage:
    t0 = time.monotonic()
    debian = _bootstrap(log)
    with tempfile.TemporaryDirectory(dir=images_home(), prefix=".build-") as tmp:
        work = Path(tmp)
        out = work / "out"
        out.mkdir()
        tree = debian / "rootfs"
        if recipe is not None:
            tree = work / "rootfs"
            _run(["cp", "-a", str(debian / "rootfs"), str(tree)], "copying the Debian tree")
            _bake(tree, recipe, log)
            shutil.copy2(tree / IMAGE_JSON_PATH.lstrip("/"), out / "image.json")
        for boot in ("vmlinuz", "initrd.img"):
            shutil.copy2(debian / boot, out / boot)
        used = sum(f.stat().st_size for f in tree.rglob("*") if f.is_file() and not f.is_symlink())
        size_mb = used // 2**20 + HEADROOM_GB * 1024
        disk = out / "rootfs.img"
        mke2fs = ["mke2fs", "-q", "-t", "ext4", "-L", "rootfs", "-d", str(tree), str(disk), f"{size_mb}M"]
        _run(mke2fs, "mke2fs")
        if image.dir.exists():
            shutil.rmtree(image.dir)
        out.rename(image.dir)
    log(f"image {image.dir.name}: built in {time.monotonic() - t0:.0f}s at {image.dir}")
    return image


def _bootstrap(log: Log) -> Path:
    """Debian with the packages and the set-up every flavor shares (the `base` image's tree, with
    its kernel and initrd), made once per package list and set-up: each flavor copies it and bakes
    its recipe on top instead of bootstrapping Debian again."""
    root = images_home() / f"debian-{_bootstrap_key()}"
    if (root / "initrd.img").is_file():
        return root
    t0 = time.monotonic()
    house = wheelhouse(["awscli"])
    with tempfile.TemporaryDirectory(dir=images_home(), prefix=".debian-") as tmp:
        work = Path(tmp)
        stage = work / "stage"
        shutil.copytree(house, stage / "wheelhouse", ignore=shutil.ignore_patterns("simple"))
        shutil.copy2(SETUP, stage / "setup.sh")
        done = work / "debian"
        done.mkdir()
        log(f"debian {root.name}: mmdebstrap {SUITE} and the node set-up (a few minutes, once)")
        _run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=minbase",
                f"--include={PACKAGES}",
                f"--customize-hook=copy-in {stage} /tmp",
                '--customize-hook=mv "$1/tmp/stage" "$1/tmp/dlinfra-build"',
                '--customize-hook=chroot "$1" sh /tmp/dlinfra-build/setup.sh',
                '--customize-hook=rm -rf "$1/tmp/dlinfra-build"',
                f'--customize-hook=cp -L "$1"/boot/vmlinuz-* {done}/vmlinuz',
                f'--customize-hook=cp -L "$1"/boot/initrd.img-* {done}/initrd.img',
                SUITE,
                str(done / "rootfs"),
                *MIRRORS,
            ],
            "mmdebstrap",
        )
        if root.exists():
            shutil.rmtree(root)
        done.rename(root)
    log(f"debian {root.name}: made in {time.monotonic() - t0:.0f}s")
    return root


def _bake(tree: Path, recipe: Recipe, log: Log) -> None:
    """Run the recipe as root in the tree's chroot, offline: pip installs the lock from a staged
    wheelhouse of exactly the locked files."""
    stage = tree / "tmp" / "dlinfra-build"
    stage.mkdir(parents=True)
    (stage / "env.lock").write_text(recipe.lock.text, encoding="utf-8")
    log(f"recipe {recipe.digest[:12]}: downloading the lock's {len(recipe.lock.pins())} wheels")
    house = wheelhouse(["--no-deps", "--require-hashes", "-r", str(stage / "env.lock")])
    shutil.copytree(house, stage / "wheelhouse", ignore=shutil.ignore_patterns("simple"))
    shutil.copy2(recipe.wheel, stage / recipe.wheel.name)
    inside = "/tmp/dlinfra-build"
    if recipe.tools:
        log(f"recipe {recipe.digest[:12]}: staging terraform and the run stacks' providers")
        terraform_tools.stage(stage / "terraform-tools")
    script = recipe.render(
        f"{inside}/{recipe.wheel.name}",
        f"{inside}/env.lock",
        f"--no-index --find-links {inside}/wheelhouse",
        "local",
        f"{inside}/terraform-tools" if recipe.tools else None,
    )
    (stage / "recipe.sh").write_text(script, encoding="utf-8")
    log(f"recipe {recipe.digest[:12]}: baking the {recipe.flavor} environment")
    # A private mount namespace: the chroot's /dev and /proc vanish with it, whatever happens.
    mounted_chroot = 'mount --rbind /dev "$0/dev" && mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
    _run(
        ["unshare", "--mount", "--fork", "sh", "-c", mounted_chroot, str(tree), "sh", f"{inside}/recipe.sh"],
        "recipe",
    )
    shutil.rmtree(stage)


def _run(cmd: list[str], what: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        output = (result.stderr or result.stdout)[-3000:]
        raise DlinfraError(f"{what} failed (exit {result.returncode}):\n{output}")
