"""`dlinfra image build`: bake the node environment into an image once, instead of a pip install at
every boot."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from dlinfra.cli.console import err, out
from dlinfra.cli.options import SpecArg, with_overrides

if TYPE_CHECKING:  # loaded when a command runs: `--help` stays fast
    from dlinfra.environment.lock import Platform
    from dlinfra.images import Recipe
    from dlinfra.spec.loading import Overrides
    from dlinfra.spec.model import Spec

image_app = typer.Typer(
    help="Node images: the environment nodes boot into, baked once.", no_args_is_help=True
)


@image_app.command()
@with_overrides("endpoint_url")
def build(
    spec: SpecArg = None,
    flavor: Annotated[
        str,
        typer.Option(
            "--flavor",
            help="cpu: tensorflow-cpu; gpu: tensorflow[and-cuda]; base (local only): no node environment, "
            "the stand-in for a cloud base image whose nodes install at boot; controller: "
            "the account controller's (dlinfra, terraform and the AWS provider; no TensorFlow).",
        ),
    ] = "cpu",
    target: Annotated[
        str, typer.Option("--target", help="local: kernel, initrd and root disk for qemu; aws: an AMI.")
    ] = "local",
    *,
    overrides: Overrides,
) -> None:
    """Build the node image of this dlinfra (cached: an image with the same recipe digest is reused)."""
    from dlinfra.errors import SpecError

    if target not in BUILDERS:
        raise SpecError([f"--target {target}: Fix: use one of {', '.join(BUILDERS)}"])
    flavors, build_with = BUILDERS[target]
    if flavor not in flavors:
        raise SpecError([f"--flavor {flavor}: Fix: use one of {', '.join(flavors)} with --target {target}"])
    out.print(build_with(spec, flavor, overrides), markup=False)


def _log(line: str) -> None:
    err.print(line, markup=False)


def _local(spec: Path | None, flavor: str, overrides: Overrides) -> str:
    """A qemu image (--emulate-instances=vm boots it); `base` has no node environment."""
    from dlinfra.images import local
    from dlinfra.images.vm import VM_PLATFORM
    from dlinfra.runs.wheel import node_wheel

    if flavor == "base":
        return str(local.build("base", None, None, _log).dir)
    recipe = _recipe(spec, flavor, overrides, lambda _: VM_PLATFORM)
    return str(local.build(recipe.flavor, node_wheel(), recipe.lock, _log).dir)


def _aws(spec: Path | None, flavor: str, overrides: Overrides) -> str:
    """An AMI in the spec's region (and endpoint), from the spec's base AMI."""
    from dlinfra.cli.loading import load_checked
    from dlinfra.targets.aws import AwsTarget
    from dlinfra.targets.aws.images import bake
    from dlinfra.targets.base import TargetOptions

    if flavor != "controller":
        recipe = _recipe(spec, flavor, overrides, AwsTarget(TargetOptions()).node_platform)
        return bake(load_checked(spec, overrides), recipe, _log)
    from dlinfra.environment.lock import Platform
    from dlinfra.images import terraform_tools

    # the controller's instance (the catalog's cheapest type) is x86_64, whatever the workers are
    recipe = _recipe(spec, flavor, overrides, lambda s: Platform(s.aws.python, "x86_64"))
    # terraform and the providers: fetched by the builder, checked against this machine's
    recipe = dataclasses.replace(recipe, tools=terraform_tools.digest())
    return bake(load_checked(spec, overrides), recipe, _log)


def _recipe(
    spec_path: Path | None, flavor: str, overrides: Overrides, platform: Callable[[Spec], Platform]
) -> Recipe:
    """The running dlinfra's wheel on the lock a run of the experiment takes for the image's platform
    (dlinfra's node dependencies and its `training.requirements`): the one this machine resolved last
    for the same inputs, as `deploy` takes it, else resolved now. A run then boots with nothing to
    install; an image baked from a lock resolved anew while the deploy took an older one (the index
    moved between) installed at every boot."""
    from dlinfra.cli.loading import load_checked
    from dlinfra.environment.lock import Flavor, Index
    from dlinfra.environment.lock_cache import locked
    from dlinfra.images import Recipe
    from dlinfra.prepare import NodeInstall
    from dlinfra.runs.wheel import node_wheel_started

    install = NodeInstall(built=node_wheel_started())
    spec = load_checked(spec_path, overrides)
    index = Index.of(spec.aws.pip_index_url, spec.aws.pip_extra_ca, os.environ)
    script = spec.training.command is not None  # the same lock its runs resolve (prepare.Environment)
    # the controller runs no training: dlinfra's own dependencies, none of the experiment's
    requirements = [] if flavor == "controller" else spec.training.requirements
    kind = cast(Flavor, flavor)
    lock = locked(install.lock_source, requirements, kind, platform(spec), index, script, fresh=False)
    wheel = install.wheel
    assert wheel is not None, "a node wheel: this checkout's, or the installed dlinfra's"
    _log(f"lock {lock.sha256[:12]}: {len(lock.pins())} packages for {lock.platform} ({index.shown()})")
    return Recipe(kind, wheel, lock)


# Where an image goes → the flavors it can hold and its builder.
BUILDERS: dict[str, tuple[tuple[str, ...], Callable[[Path | None, str, Overrides], str]]] = {
    "local": (("base", "cpu", "gpu", "controller"), _local),
    "aws": (("cpu", "gpu", "controller"), _aws),
}
