"""A script that hangs, and a script that trains alone, named while they run (issue 56, part 6): a
real 2-worker MultiWorkerMirroredStrategy loop whose worker 1 hangs in its own code, and a script
that ignores TF_CONFIG."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dlinfra.node.script import ALONE_AFTER

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


def test_a_script_that_trains_alone_is_refused_after_a_minute_not_at_its_end_and_its_model_kept(
    tmp_path: Path,
) -> None:
    """Each worker's script ignores TF_CONFIG and would train for ten minutes: the owner's agent
    refuses it once it has run ALONE_AFTER without serving on its address, and keeps its model."""
    project = user_project(
        tmp_path,
        "misbehaving.py",
        "name: alone\nstrategy: multi_worker_mirrored\n"
        "training:\n  command: [python, train.py, --mode, alone-for-long]\n",
    )
    run = deploy_project(tmp_path, project, "--workers", "2")
    failed = failed_marker(run)
    assert failed["verdict"] == "alone" and failed["node"] == "worker-0", failed
    started = json.loads((run.store / "status" / "worker-0.json").read_text())["phases"]["program"]
    assert ALONE_AFTER <= failed["time"] - started < ALONE_AFTER + 30, failed["time"] - started
    assert re.search(r"ran \d+s, training, without ever serving", str(failed["error"])), failed
    assert "what it wrote into DLINFRA_MODEL_DIR is kept at " in str(failed["error"]), failed
    assert (run.store / "model" / "model.txt").read_text() == "a model trained alone\n"
    # it reports nothing: the deploy line says it runs, and how busy it is, not `starting`
    assert re.search(r"nodes up 2/2 · running · no progress reported · CPU \d+%", run.result.stdout)
