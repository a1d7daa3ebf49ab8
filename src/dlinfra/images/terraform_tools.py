"""What the account controller's image carries beside dlinfra: the terraform this machine runs and the
providers the run stacks require, so the controller applies, heals and destroys runs with no
registry to reach and with exactly the provider builds the runs' lock files name (their hashes are
checked at `terraform init`)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from dlinfra.errors import DlinfraError
from dlinfra.runs.bundle import file_sha256
from dlinfra.terraform import find_terraform

STACK_VERSIONS = Path(__file__).parents[1] / "infra" / "stack" / "versions.tf"
PLATFORM = "linux_amd64"  # the controller's instance type (the catalog's cheapest) is x86_64


def digest() -> str:
    """What the tools add to an image: this terraform binary and the providers the stacks require."""
    binary, _ = find_terraform()
    h = hashlib.sha256()
    for part in (file_sha256(Path(binary)), STACK_VERSIONS.read_text(encoding="utf-8"), PLATFORM):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def stage(dest: Path) -> None:
    """`dest/terraform`, and `dest/plugins` (the providers as an unpacked mirror), installed the way
    this machine's terraform installs them (its CLI config: a mirror, or the registry)."""
    binary, _ = find_terraform()
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, dest / "terraform")
    with tempfile.TemporaryDirectory(prefix="dlinfra-providers-") as tmp:
        shutil.copy2(STACK_VERSIONS, Path(tmp) / "versions.tf")
        result = subprocess.run(
            [binary, "init", "-input=false", "-no-color", "-backend=false"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if result.returncode != 0:
            raise DlinfraError(
                "terraform could not install the run stacks' providers for the controller image. Fix: make "
                "the AWS provider reachable (the registry, or a mirror in the CLI config):\n"
                + result.stdout[-2000:]
            )
        # .terraform/providers is laid out as a mirror is; entries may link into a plugin cache
        shutil.copytree(Path(tmp) / ".terraform" / "providers", dest / "plugins", symlinks=False)
