"""`dlinfra preflight`: the checks alone, on a fresh cluster of the experiment."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from dlinfra.cli.clock import command_started
from dlinfra.cli.loading import load_checked
from dlinfra.cli.options import ALL_OVERRIDES, EmulateOpt, SpecArg, YesOpt, with_overrides
from dlinfra.cli.running import approver, report

if TYPE_CHECKING:
    from dlinfra.spec.loading import Overrides


@with_overrides(*ALL_OVERRIDES)
def preflight(
    spec: SpecArg = None, yes: YesOpt = False, emulate_instances: EmulateOpt = None, *, overrides: Overrides
) -> None:
    """Only the preflight checks, on a fresh cluster of the experiment: the table, then teardown.
    Exit 0 when no node was flagged, 1 when one was (a new instance type or AMI, tried cheaply)."""
    from dlinfra.deploy import Request
    from dlinfra.deploy import deploy as run_deploy

    started = command_started()
    loaded = load_checked(spec, overrides)
    asked = loaded.cluster.preflight
    only = asked.model_copy(
        update={"checks": "quick" if asked.checks in (None, "off") else asked.checks, "only": True}
    )
    checked = loaded.model_copy(update={"cluster": loaded.cluster.model_copy(update={"preflight": only})})
    request = Request(checked, spec, sys.argv)
    report(
        lambda options, progress: run_deploy(request, options, approver(yes), progress, started),
        emulate_instances,
    )
