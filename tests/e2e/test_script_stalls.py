"""A script that hangs, and a script that trains alone, named while they run (issue 56, part 6): a
real 2-worker MultiWorkerMirroredStrategy loop whose worker 1 hangs in its own code, and a script
that ignores TF_CONFIG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .script_projects import deploy_project, failed_marker, user_project

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_hung_script_reporting_every_2s_is_named_by_the_node_that_hung_within_60s(tmp_path: Path) -> None:
    project = user_project(
        tmp_path,
        "mwms_hang.py",
        "name: hang\nstrategy: multi_worker_mirrored\ntraining:\n  command: [python, train.py]\n",
    )
    run = deploy_project(tmp_path, project, "--workers", "2")
    failed = failed_marker(run)
    assert failed["verdict"] == "stalled", failed
    assert failed["node"] == "worker-1", failed
    assert str(failed["error"]).startswith("stalled: "), failed
    assert "wait_for_something_that_never_comes" in str(failed["stacks"]["worker-1"]), failed
    last_step = max(
        json.loads((run.store / "status" / f"worker-{i}.json").read_text())["progress_at"] for i in (0, 1)
    )
    assert failed["time"] - last_step < 60, f"named {failed['time'] - last_step:.0f}s after the last step"
