"""Script mode's failure modes: each gets a verdict a user understands, named in the result, with
nothing left running. The script (tests/data/scripts/misbehaving.py) imports no TensorFlow."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import Deployed
from .script_projects import deploy_project, failed_marker, user_project

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _misbehaving(tmp: Path, mode: str, extra: str = "", workers: int = 2) -> Deployed:
    project = user_project(
        tmp,
        "misbehaving.py",
        f"name: {mode}\nstrategy: multi_worker_mirrored\n{extra}"
        f"training:\n  command: [python, train.py, --mode, {mode}]\n",
    )
    return deploy_project(tmp, project, "--workers", str(workers))


def test_a_script_that_exits_non_zero_on_one_worker_fails_the_run_naming_it(tmp_path: Path) -> None:
    run = _misbehaving(tmp_path, "exit-on-worker-1")
    failed = failed_marker(run)
    assert failed["node"] == "worker-1" and failed["verdict"] == "script"
    assert "exited with code 3" in str(failed["error"])
    assert "label of 11" in str(failed["error"]), "the script's own last error line is named"
    assert len(json.dumps(failed)) < 8000
    assert "worker-1" in run.result.stderr and "code 3" in run.result.stderr


def test_a_script_that_hangs_before_its_first_step_is_stalled_with_where_it_waits(tmp_path: Path) -> None:
    run = _misbehaving(tmp_path, "hang", "cluster: {stall_timeout: 20}\n")
    failed = failed_marker(run)
    assert failed["verdict"] == "stalled", failed
    dump = (run.store / "debug" / "worker-0.stacks.txt").read_text()
    assert re.search(r"hang_forever \(\S*train\.py:\d+\)", dump), dump


def test_a_script_that_ignores_tf_config_and_trains_alone_is_refused(tmp_path: Path) -> None:
    failed = failed_marker(_misbehaving(tmp_path, "alone"))
    assert failed["verdict"] == "alone" and failed["node"] == "worker-0"
    assert "ignored TF_CONFIG" in str(failed["error"])


def test_a_script_that_writes_no_model_fails_naming_the_directory(tmp_path: Path) -> None:
    failed = failed_marker(_misbehaving(tmp_path, "no-model"))
    assert failed["verdict"] == "no model"
    assert "DLINFRA_MODEL_DIR" in str(failed["error"])


def test_a_command_that_does_not_exist_fails_on_the_node_naming_it(tmp_path: Path) -> None:
    project = user_project(
        tmp_path,
        "misbehaving.py",
        "name: no-such\nstrategy: multi_worker_mirrored\ntraining:\n  command: [trian-typo, --epochs, 3]\n",
    )
    failed = failed_marker(deploy_project(tmp_path, project, "--workers", "2"))
    assert failed["verdict"] == "command"
    assert "'trian-typo'" in str(failed["error"]) and "No such file" in str(failed["error"])
