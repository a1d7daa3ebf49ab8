"""What the account controller's image carries beside dlinfra: the terraform this machine runs and the
providers the run stacks require, so the controller applies, heals and destroys runs with no
registry to reach and with exactly the provider builds the runs' lock files name (their hashes are
checked at `terraform init`)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from dlinfra.errors import DlinfraError
from dlinfra.runs.bundle import file_sha256
from dlinfra.terraform import find_terraform

STACK_VERSIONS = Path(__file__).parents[1] / "infra" / "stack" / "versions.tf"
PLATFORM = "linux_amd64"  # the controller's instance type (the catalog's cheapest) is x86_64
RELEASES = "https://releases.hashicorp.com"


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
        _init(binary, Path(tmp))
        # .terraform/providers is laid out as a mirror is; entries may link into a plugin cache
        shutil.copytree(Path(tmp) / ".terraform" / "providers", dest / "plugins", symlinks=False)


def fetch_script(dest: str, releases: str = RELEASES) -> str:
    """What stage() makes, made on an AMI builder (it has the internet; this machine's 700 MB of
    providers need not travel): terraform from HashiCorp's releases and the providers from the
    registry, each checked against this machine's: the binary's sha256, and the providers' hashes in
    the lock file terraform wrote here (`init -lockfile=readonly` refuses any other build)."""
    binary, _ = find_terraform()
    version = terraform_version()
    with tempfile.TemporaryDirectory(prefix="dlinfra-providers-") as tmp:
        _init(binary, Path(tmp))
        lock = (Path(tmp) / ".terraform.lock.hcl").read_text(encoding="utf-8")
    zip_url = f"{releases}/terraform/{version}/terraform_{version}_{PLATFORM}.zip"
    return f"""#!/bin/sh
# terraform {version} and the run stacks' providers for the controller image, checked against the
# builds `dlinfra image build` ran with.
set -eu
dest={dest}
mkdir -p "$dest/init"
curl -fsSL --retry 5 -o "$dest/terraform.zip" {zip_url}
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("terraform", sys.argv[2])' \
    "$dest/terraform.zip" "$dest"
chmod 0755 "$dest/terraform"
if ! echo "{file_sha256(Path(binary))}  $dest/terraform" | sha256sum -c - >/dev/null; then
    echo "dlinfra: {zip_url} is not the terraform {version} build the image was made with" >&2
    exit 1
fi
cat > "$dest/init/versions.tf" <<'DLINFRA_EOF'
{STACK_VERSIONS.read_text(encoding="utf-8").rstrip()}
DLINFRA_EOF
cat > "$dest/init/.terraform.lock.hcl" <<'DLINFRA_EOF'
{lock.rstrip()}
DLINFRA_EOF
(cd "$dest/init" && "$dest/terraform" init -input=false -no-color -backend=false -lockfile=readonly)
cp -RL "$dest/init/.terraform/providers" "$dest/plugins"  # a plugin cache leaves links
"""


def terraform_version() -> str:
    binary, _ = find_terraform()
    shown = subprocess.run(
        [binary, "version", "-json"], capture_output=True, text=True, timeout=60, check=True
    )
    return str(json.loads(shown.stdout)["terraform_version"])


def _init(binary: str, work: Path) -> None:
    shutil.copy2(STACK_VERSIONS, work / "versions.tf")
    result = subprocess.run(
        [binary, "init", "-input=false", "-no-color", "-backend=false"],
        cwd=work,
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
