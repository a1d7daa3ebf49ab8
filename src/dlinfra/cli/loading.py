"""The spec a command runs: loaded with its overrides and checked against its target's hardware,
with warnings about what is allowed but likely a mistake. Every command that takes an experiment
file loads it here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dlinfra.cli.console import err

if TYPE_CHECKING:
    from dlinfra.spec.loading import Overrides
    from dlinfra.spec.model import Spec


def load_checked(path: Path | None, overrides: Overrides) -> Spec:
    """The resolved spec, after warning about what is allowed but likely a mistake."""
    from dlinfra.spec.loading import load_spec
    from dlinfra.targets import hardware_problems

    resolved = load_spec(path, overrides, check=hardware_problems)
    base = path.absolute().parent if path else Path.cwd()
    if resolved.training.entrypoint:
        from dlinfra.runs.bundle import entrypoint_file

        entrypoint_file(resolved.training.entrypoint, base)
    if resolved.training.command:
        from dlinfra.runs.bundle import command_file

        command_file(resolved.training.command, base)
    warn_hardware(resolved)
    return resolved


def warn_hardware(spec: Spec) -> None:
    from dlinfra.spec.hardware import warnings
    from dlinfra.targets import uses_instance_types

    for warning in warnings(spec, uses_instance_types(spec.target)):
        err.print(f"warning: {warning}", markup=False, highlight=False)


def environment_line(spec: Spec) -> str:
    """What the nodes' environment holds beside training.requirements (one rule: docs/script.md)."""
    from dlinfra.environment.lock import beside

    script = spec.training.command is not None
    own = f"training.requirements ({len(spec.training.requirements)})"
    return f"environment: {own} + {beside(spec.training.requirements, script)}"
