"""Script mode's failure modes: each gets a verdict a user understands, named in the result, with
nothing left running. The script (tests/data/scripts/misbehaving.py) imports no TensorFlow."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import run_cli

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
    assert "DLINFRA_MODEL_DIR is kept at" in str(failed["error"]), "its model is the run's output"


def test_a_script_that_leaves_only_notes_in_its_model_dir_is_done_with_no_model_saved(tmp_path: Path) -> None:
    """A model directory holding nothing TensorFlow loads: DONE, the result and `runs` say no model
    was saved and what was found; the notes are uploaded all the same, as SageMaker and Vertex would."""
    run = _misbehaving(tmp_path, "no-model")
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    found = "found NOTES.txt (32 bytes), no SavedModel/.keras/.h5"
    assert f"model: none: no model saved ({found}); no checkpoint either" in run.result.stdout
    assert run.metrics["no_model"] == found and run.metrics["models"] == []
    assert (run.store / "model" / "NOTES.txt").read_text() == "notes: trained, model elsewhere\n"
    assert f"what its model directory held at {run.metrics['model_uri']}" in run.result.stdout
    assert json.loads((run.store / "DONE").read_text())["reason"] == "no model saved"
    env = dict(os.environ, DLINFRA_HOME=str(run.home), COLUMNS="200")
    listed = run_cli("runs", env=env, cwd=tmp_path)
    assert "DONE · no model" in listed.stdout, listed.stdout
    as_json = json.loads(run_cli("runs", "--json", env=env, cwd=tmp_path).stdout)
    assert [(r["status"], r["note"]) for r in as_json] == [("DONE", "no model")]
    shown = json.loads(run_cli("show", run.run_id, "--json", env=env, cwd=tmp_path).stdout)
    assert shown["model"] is None and shown["no_model"].startswith(found), shown["no_model"]


def test_a_command_that_does_not_exist_fails_on_the_node_naming_it(tmp_path: Path) -> None:
    project = user_project(
        tmp_path,
        "misbehaving.py",
        "name: no-such\nstrategy: multi_worker_mirrored\ntraining:\n  command: [trian-typo, --epochs, 3]\n",
    )
    failed = failed_marker(deploy_project(tmp_path, project, "--workers", "2"))
    assert failed["verdict"] == "command"
    assert "'trian-typo'" in str(failed["error"]) and "No such file" in str(failed["error"])


def test_a_checkpoint_directory_past_the_cap_fails_the_run_naming_the_cap(tmp_path: Path) -> None:
    project = user_project(
        tmp_path,
        "misbehaving.py",
        "name: sparse\nstrategy: multi_worker_mirrored\ntraining:\n"
        "  command: [python, train.py, --mode, sparse-checkpoint]\n  outputs_max_gb: 1\n",
    )
    run = deploy_project(tmp_path, project, "--workers", "2")
    failed = failed_marker(run)
    assert failed["verdict"] == "outputs" and failed["node"] == "worker-0", failed
    assert "DLINFRA_CHECKPOINT_DIR holds 2 GB" in str(failed["error"])
    assert "training.outputs_max_gb (1 GB)" in str(failed["error"])
    assert not (run.store / "checkpoints").exists(), "nothing of it was uploaded"


def test_a_script_that_links_out_of_its_directories_and_daemonizes_leaks_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """Issue 55, classes 1 and 4, in one real run: each worker's script links a file outside the
    node's directories into its model, checkpoint and TensorBoard directories, leaves a FIFO in its
    model and starts a daemon (fork, setsid, fork) before it exits 0."""
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET)
    with _daemonizing_run(tmp_path, "leave-behind", "--outside", str(outside)) as (run, daemons):
        assert run.result.returncode == 0, run.result.stdout + run.result.stderr
        assert sorted(daemons) == ["worker-0", "worker-1"], "each worker's script started its daemon"
        assert _alive(daemons) == [], "a daemon outlived its run"
        stored = [p for p in run.store.rglob("*") if p.is_file()]
        assert not [p for p in stored if SECRET.encode() in p.read_bytes()], "a file outside was stored"
        assert (run.store / "model" / "model.txt").is_file()
        refused = run.metrics["outputs_refused"]
        for where in ("DLINFRA_MODEL_DIR", "DLINFRA_CHECKPOINT_DIR", "DLINFRA_TENSORBOARD_DIR"):
            assert f"{where}: 'leak-worker-0' is a link out of it: refused, not uploaded" in refused
        assert (
            "DLINFRA_MODEL_DIR: 'pipe' is not a regular file (a FIFO, socket or device): skipped" in refused
        )
        assert "DLINFRA_MODEL_DIR: 'leak-worker-0' is a link out of it" in run.result.stdout
        log = (run.store / "logs" / "worker-1.log").read_text()
        assert "ended 1 processes the script left running" in log


def test_a_script_and_its_daemon_that_ignore_the_stop_leave_nothing_after_done(tmp_path: Path) -> None:
    """Worker 0 ends the run DONE; worker 1's script ignores SIGTERM, as does the daemon it left. The
    launcher SIGKILLs a node's beacon 10 s after its SIGTERM, which would orphan the daemon to init:
    the beacon ends it first (issue 55, class 4)."""
    with _daemonizing_run(tmp_path, "ignore-term") as (run, daemons):
        assert run.result.returncode == 0, run.result.stdout + run.result.stderr
        assert list(daemons) == ["worker-1"]
        assert _alive(daemons) == [], "the daemon outlived its run"


@contextlib.contextmanager
def _daemonizing_run(tmp: Path, mode: str, *flags: str) -> Iterator[tuple[Deployed, dict[str, int]]]:
    """A run of misbehaving.py's `mode`, its scripts' daemons by node; whatever the test found, those
    still running after it are killed."""
    pids = tmp / "daemons"
    pids.mkdir()
    command = ", ".join(["python", "train.py", "--mode", mode, *flags, "--pids", str(pids)])
    spec = f"name: {mode}\nstrategy: multi_worker_mirrored\ntraining:\n  command: [{command}]\n"
    run = deploy_project(tmp, user_project(tmp, "misbehaving.py", spec), "--workers", "2")
    daemons = {p.name: int(p.read_text()) for p in pids.iterdir()}
    try:
        yield run, daemons
    finally:
        for pid in _alive(daemons):
            os.kill(pid, signal.SIGKILL)


SECRET = "the node's own file, not the script's output"


def _alive(daemons: dict[str, int]) -> list[int]:
    """The daemons still running (a pid is theirs while its command line names them)."""
    alive = []
    for node, pid in daemons.items():
        try:
            if f"daemon-of-{node}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                alive.append(pid)
        except OSError:
            pass
    return alive
