"""Which AMI each role boots, decided at plan time (`aws.image`) and pinned in the manifest: a
baked node image of the role's flavor when `dlinfra image build --target aws` made one for this
dlinfra, else the base AMI (aws.ami, or the Deep Learning AMI), whose nodes install at boot."""

from __future__ import annotations

from typing import Any

from dlinfra import __version__
from dlinfra.errors import SpecError
from dlinfra.images import flavor_for
from dlinfra.node.config import NodeConfig
from dlinfra.records import ImagePin
from dlinfra.spec import Spec
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
            ImagePin(id=found["id"], digest=found["digest"], dlinfra_version=__version__) if found else None
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


def describe(chosen: dict[str, ImagePin | None]) -> str:
    parts = []
    for role, pin in chosen.items():
        if pin is None:
            parts.append(f"{role}: base AMI, installs dlinfra and TensorFlow at boot")
        else:
            parts.append(f"{role}: {pin.id} (baked, dlinfra {pin.dlinfra_version}, recipe {pin.digest[:12]})")
    return "Images: " + "; ".join(parts) + "."
