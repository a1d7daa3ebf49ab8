"""The target registry: the one place that maps a spec's `target` to the module that runs it.

Targets differ only in where nodes run and how they are started and addressed; the renderer and
the node agent are shared. A new target is one new module here, registered below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dlinfra.errors import SpecError
from dlinfra.spec.input import shown

if TYPE_CHECKING:
    from dlinfra.spec.loading import Problem
    from dlinfra.spec.model import Spec
    from dlinfra.targets.base import Target, TargetOptions

# name → module defining `TARGET`, a class implementing targets.base.Target. Imported on use:
# `--help` must not pay for boto3.
REGISTRY = {
    "local": "dlinfra.targets.local",
    "aws": "dlinfra.targets.aws",
}
# each target's `uses_instance_types`, known without importing it: validating a spec (advise, plan's
# first check) must not pay for the aws target's imports (a test keeps the two equal)
INSTANCE_TYPED = {"local": False, "aws": True}


def hardware_problems(spec: Spec) -> list[Problem]:
    """What the instance catalog says cannot work on the spec's target (load_spec's `check`)."""
    from dlinfra.spec.hardware import problems

    return problems(spec, uses_instance_types(spec.target))


def uses_instance_types(name: str) -> bool:
    """Whether the target runs each node on the spec's instance type (what `gpus: auto` reads)."""
    if name not in REGISTRY:
        raise SpecError([f"target: {shown(name)} is not a target. Fix: use one of {', '.join(REGISTRY)}"])
    return INSTANCE_TYPED[name]


def target_for(name: str, options: TargetOptions | None = None) -> Target:
    if name not in REGISTRY:
        raise SpecError([f"target: {shown(name)} is not a target. Fix: use one of {', '.join(REGISTRY)}"])
    from dlinfra.targets.base import TargetOptions

    module = importlib.import_module(REGISTRY[name])
    return module.TARGET(options or TargetOptions())
