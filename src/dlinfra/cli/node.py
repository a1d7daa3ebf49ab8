"""`dlinfra node …`: what runs on a cluster node (cloud-init starts it; the local target too)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

node_app = typer.Typer(help="Commands that run on a cluster node.", no_args_is_help=True)


LogOpt = Annotated[Path | None, typer.Option("--log-file", help="Append this node's output here.")]
WorkOpt = Annotated[
    Path | None, typer.Option("--work-dir", help="Local scratch (checkpoints, model, state).")
]
ConfigArg = Annotated[Path, typer.Argument(help="The NodeConfig, e.g. /etc/dlinfra/node.json.")]


@node_app.command("run")
def node_run(node_json: ConfigArg, log_file: LogOpt = None, work_dir: WorkOpt = None) -> None:
    """Run this machine's part of the cluster (what cloud-init starts on every node): the beacon,
    which starts the trainer and reports on it from outside."""
    from dlinfra.node.beacon import run

    sys.exit(run(node_json, log_file, work_dir))
