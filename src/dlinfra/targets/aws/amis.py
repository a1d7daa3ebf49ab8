"""Which AMI each role boots, decided at plan time (`aws.image`) and pinned in the manifest: a
baked node image of the role's flavor when `dlinfra image build --target aws` made one for this
dlinfra, else the base AMI (aws.ami, or the Deep Learning AMI), whose nodes install at boot."""

from __future__ import annotations

from typing import Any

from dlinfra import __version__
from dlinfra.contract import NodeConfig
from dlinfra.errors import SpecError
from dlinfra.images import flavor_for
from dlinfra.runs.manifest import ImagePin
from dlinfra.spec.model import Spec
from dlinfra.targets.aws.images import find_baked

BUILD = "dlinfra image build --target aws"


def role_flavors(configs: dict[str, NodeConfig]) -> dict[str, str]:
    flavors: dict[str, str] = {}
    for cfg in configs.values():
        if flavor_for(cfg.gpus) == "gpu" or cfg.role not in flavors:
            flavors[cfg.role] = flavor_for(cfg.gpus)
    return flavors


def choose(
    spec: Spec, flavors: dict[str, str], ec2: Any, pinned: dict[str, ImagePin]
) -> dict[str, ImagePin | None]:
    """role → its baked AMI, or None for the base AMI. `pinned`: a rerun's images, used as they were."""
    chosen: dict[str, ImagePin | None] = {}
    problems = []
    for role, flavor in sorted(flavors.items()):
        if role in pinned:
            chosen[role] = pinned[role] if pinned[role].digest else None
            continue
        found = find_baked(ec2, __version__, flavor) if spec.aws.image != "base" else None
        if found is None and spec.aws.image == "baked":
            problems.append(
                f"aws.image: baked, and no {flavor} AMI is baked for dlinfra {__version__}. Fix: {BUILD}"
            )
        chosen[role] = (
            ImagePin(
                id=found["id"],
                digest=found["digest"],
                dlinfra_version=__version__,
                lock_sha256=found["lock_sha256"],
            )
            if found
            else None
        )
    installs = sorted(role for role, pin in chosen.items() if pin is None)
    if installs and spec.aws.egress == "none" and not spec.aws.pip_index_url:
        problems.append(
            f"aws.egress: none, and {', '.join(installs)} would install TensorFlow at boot from PyPI. "
            f"Fix: bake the image ({BUILD}), or set aws.pip_index_url to a mirror inside the VPC"
        )
    if problems:
        raise SpecError(problems)
    return chosen


def check_exists(spec: Spec, ec2: Any, rerun_of: str | None) -> None:
    """aws.ami must name an AMI of the region: a deregistered one fails here, not mid-apply. A rerun
    pins the AMI its original booted, so for a rerun this is the check that the image is still there."""
    if spec.aws.ami is None:
        return
    from botocore.exceptions import ClientError  # the aws extra: present wherever ec2 is

    try:
        found = ec2.describe_images(ImageIds=[spec.aws.ami])["Images"]
    except ClientError as exc:
        if not exc.response.get("Error", {}).get("Code", "").startswith("InvalidAMIID"):
            raise
        found = []
    if found:
        return
    if rerun_of:
        raise SpecError(
            [
                f"aws.ami: {spec.aws.ami}, the AMI run {rerun_of} booted (a rerun pins it), no longer exists "
                f"in {spec.aws.region}. Fix: rerun on another image with --set aws.ami=AMI_ID (the run then "
                "differs from the original), or deploy the experiment anew"
            ]
        )
    raise SpecError(
        [
            f"aws.ami: {spec.aws.ami} does not exist in {spec.aws.region} (deregistered, or another "
            "region's). Fix: an AMI id of this region, or leave aws.ami out for the Deep Learning AMI"
        ]
    )


def describe(chosen: dict[str, ImagePin | None], base_ami: str | None = None) -> str:
    base = f"base AMI {base_ami}" if base_ami else "base AMI"
    parts = []
    for role, pin in chosen.items():
        if pin is None:
            parts.append(f"{role}: {base}, installs dlinfra and TensorFlow at boot")
        else:
            # a pin recorded without its recipe (an older manifest) is still described, not a TypeError
            recipe = pin.digest[:12] if pin.digest else "unrecorded"
            parts.append(f"{role}: {pin.id} (baked, dlinfra {pin.dlinfra_version}, recipe {recipe})")
    return "Images: " + "; ".join(parts) + "."
