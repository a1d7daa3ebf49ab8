"""A user's script-mode project for the e2e tests: their script beside the experiment file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support import alive_node_pids

from .conftest import Deployed, deploy

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"
# Scripts written for Keras 2 (TensorFlow's guides): tf-keras in their environment, and switched on
TF_KERAS = "  requirements: [tensorflow==2.21.*, tf-keras==2.21.*, tensorboard==2.21.*]\n"
LEGACY = "env, TF_USE_LEGACY_KERAS=1, "


def user_project(tmp: Path, script: str, spec: str) -> Path:
    """A user's project: their script as train.py beside the experiment file."""
    project = tmp / "project"
    project.mkdir()
    shutil.copy(SCRIPTS / script, project / "train.py")
    (project / "experiment.yaml").write_text(spec)
    return project


def deploy_project(tmp: Path, project: Path, *args: str) -> Deployed:
    return deploy(tmp, str(project / "experiment.yaml"), *args)


def failed_marker(run: Deployed) -> dict[str, object]:
    assert run.result.returncode == 1, run.result.stdout + run.result.stderr
    assert alive_node_pids(run.run_id) == [], "a failed script run leaves nothing running"
    return json.loads((run.store / "FAILED").read_text())
