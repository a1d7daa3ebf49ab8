"""`dlinfra image build`: bake the node environment into an image once, instead of a pip install at
every boot."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from dlinfra.cli.console import err, out
from dlinfra.cli.options import SpecArg, with_overrides
from dlinfra.spec_loading import Overrides

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
    from dlinfra.cli.app import _load
    from dlinfra.errors import SpecError
    from dlinfra.wheel import node_wheel

    flavors = ("base", "cpu", "gpu") if target == "local" else ("cpu", "gpu")
    if target not in ("local", "aws"):
        raise SpecError([f"--target {target}: Fix: use local or aws"])
    if flavor not in flavors:
        raise SpecError([f"--flavor {flavor}: Fix: use one of {', '.join(flavors)} with --target {target}"])
    log = lambda line: err.print(line, markup=False)  # noqa: E731
    wheel = node_wheel()
    if target == "local":
        from dlinfra.images import local

        kind: Literal["base", "cpu", "gpu"] = flavor  # type: ignore[assignment]
        image = local.build(kind, wheel, log)
        out.print(str(image.dir), markup=False)
        return
    from dlinfra.images import Recipe
    from dlinfra.targets.aws.images import bake

    if wheel is None:
        raise SpecError(
            ["dlinfra image build --target aws bakes this checkout's wheel. Fix: run it from a checkout"]
        )
    resolved = _load(spec, overrides)
    out.print(bake(resolved, Recipe(flavor, wheel), log))  # type: ignore[arg-type]
