"""Following a run in the terminal to its end, and saying how it ended (deploy, rerun, preflight)."""

from __future__ import annotations

import sys
from typing import Any

import typer

from dlinfra.cli.console import err, out
from dlinfra.cli.console import error as _error
from dlinfra.errors import DlinfraError


def report(follow: Any, emulate: str | None) -> None:
    """Run `follow(options, progress)` with live progress, then print how the run ended."""
    import signal

    from dlinfra.cli.views import LiveTable, ProgressLines
    from dlinfra.targets.base import TargetOptions

    signal.signal(signal.SIGTERM, interrupt)  # `kill` and CI timeouts tear the cluster down too
    # A deploy started in the background by a script (`dlinfra deploy … &`) inherits SIGINT ignored
    # (bash does that for `&` jobs without job control), and Ctrl-C or `kill -INT` would then leave
    # the cluster running and billing: Ctrl-C always means stop here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    progress = LiveTable(out) if out.is_terminal else ProgressLines(out)
    try:
        outcome = follow(TargetOptions(log=out.print, emulate_instances=emulate), progress)
    except KeyboardInterrupt as exc:
        progress.close()
        notes = getattr(exc, "__notes__", [])  # a teardown that failed or was interrupted
        err.print(f"interrupted: the run is marked STOPPED{'' if notes else ' and its nodes were torn down'}")
        for note in notes:
            _error(note)
        raise typer.Exit(130) from None
    progress.close()
    finish(outcome)


def interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def approver(yes: bool) -> Any:
    def approve(summary: str) -> bool:
        out.print(summary)
        if yes:
            return True
        if not sys.stdin.isatty():
            raise DlinfraError(
                "no terminal to confirm the apply. Fix: review `dlinfra plan`, then pass --yes"
            )
        return typer.confirm("Apply this plan?", default=False)

    return approve


def finish(outcome: Any) -> None:
    from dlinfra.cli.preflight_view import preflight_view
    from dlinfra.cli.views import print_failure, result_view
    from dlinfra.contract import PREFLIGHT_ONLY
    from dlinfra.runs.results import outcome_cost

    if outcome.state in ("DONE", "FAILED") and (checked := preflight_view(outcome.run.store())):
        (out if outcome.state == "DONE" else err).print(checked)
    for straggler in outcome.stragglers:
        out.print(straggler.says(), markup=False)
    for warning in node_warnings(outcome.run):
        err.print(f"warning: {warning}", markup=False, highlight=False)
    if outcome.state == "DONE":
        if outcome.error != PREFLIGHT_ONLY:  # `dlinfra preflight` trained nothing: its table is all
            out.print(result_view(outcome))
        return
    if outcome.state in ("DETACHED", "HANDED_OVER"):
        run_id = outcome.run.id
        owner = (
            "handed to the account's controller (it heals the run and tears it down)"
            if outcome.state == "HANDED_OVER"
            else "detached"
        )
        out.print(f"run {run_id}: nodes are up, {owner}. Follow it: dlinfra watch {run_id}", markup=False)
        out.print(f"logs: dlinfra logs {run_id} -f · stop it: dlinfra destroy {run_id}", markup=False)
        return
    if outcome.state == "FAILED":
        print_failure(err, outcome)
        raise typer.Exit(1)
    err.print(f"run {outcome.run.id} STOPPED: {outcome.error}", markup=False)
    if spent := outcome_cost(outcome):
        err.print(f"cost: {spent}", markup=False)
    raise typer.Exit(1)


def node_warnings(run: Any) -> list[str]:
    """What the nodes warned of in their status (a program's unused compile() settings), each once:
    every mirrored worker says the same."""
    statuses = run.store().statuses(run.manifest().nodes).values()
    said = [warning for status in statuses if status is not None for warning in status.warnings or []]
    return list(dict.fromkeys(said))
