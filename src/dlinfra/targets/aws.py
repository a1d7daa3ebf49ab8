"""The aws target: tfvars from the address plan and user-data, Terraform apply, watch, destroy."""

from __future__ import annotations

from dlinfra import __version__


def install_requirement() -> str:
    """What cloud-init pip-installs on an instance: exactly this dlinfra version."""
    return f"dlinfra[train,aws]=={__version__}"
