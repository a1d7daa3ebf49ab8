"""`dlinfra image build`: bake the node environment into an image once, instead of a pip install at
every boot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dlinfra.cli.console import err, out
from dlinfra.cli.options import SpecArg, with_overrides

if TYPE_CHECKING:  # loaded when a command runs: `--help` stays fast
    from dlinfra.spec.loading import Overrides

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
            "the stand-in for a cloud base image whose nodes install at boot.",
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
    from dlinfra.runs.wheel import node_wheel

    return str(local.build(flavor, node_wheel(), _log).dir)  # type: ignore[arg-type]


def _aws(spec: Path | None, flavor: str, overrides: Overrides) -> str:
    """An AMI in the spec's region (and endpoint), from the spec's base AMI."""
    from dlinfra.cli.loading import load_checked
    from dlinfra.errors import SpecError
    from dlinfra.images import Recipe
    from dlinfra.runs.wheel import node_wheel
    from dlinfra.targets.aws.images import bake

    wheel = node_wheel()
    if wheel is None:
        raise SpecError(["--target aws bakes this checkout's wheel. Fix: run it from a dlinfra checkout"])
    return bake(load_checked(spec, overrides), Recipe(flavor, wheel), _log)  # type: ignore[arg-type]


# Where an image goes → the flavors it can hold and its builder.
BUILDERS: dict[str, tuple[tuple[str, ...], Callable[[Path | None, str, Overrides], str]]] = {
    "local": (("base", "cpu", "gpu"), _local),
    "aws": (("cpu", "gpu"), _aws),
}
