"""Script mode (`training.command`): programs written by others, run as they are on a local cluster,
and the ways a script goes wrong, each with a verdict a user understands and nothing left running."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlinfra.node.status import read_state, state_file
from support import alive_node_pids, aws_client, digits_beside, run_cli

from .conftest import Live, aws_emulation, start_deploy
from .script_projects import LEGACY, SCRIPTS, TF_KERAS, deploy_project, failed_marker, user_project

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _in_plain_tensorflow(code: str, *args: str) -> str:
    """Run `code` in a fresh process with TensorFlow and no dlinfra: what a user does with the run's
    model. Its last printed word."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, numpy as np, tensorflow as tf\n" + code, *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def test_a_custom_loop_adapted_from_the_mwms_guide_resumes_from_its_checkpoint_after_kill_9(
    tmp_path: Path,
) -> None:
    """TensorFlow's custom-loop MWMS guide, reporting its steps; worker 1's script killed with kill -9
    mid-run: the cluster restarts together and the guide resumes from its own checkpoint, synced
    through the store. Like the published guide it saves no model: the run is DONE, says "no model
    saved" and where its checkpoints are."""
    project = user_project(
        tmp_path,
        "mwms_custom_loop.py",
        "name: guide-mwms\nstrategy: multi_worker_mirrored\ntraining:\n"
        "  command: [python, train.py, --data, digits.npz, --checkpoint_dir, '${DLINFRA_CHECKPOINT_DIR}',\n"
        "            --epochs, 6, --steps_per_epoch, 30, --report]\n",
    )
    digits_beside(project)
    live = start_deploy(tmp_path, str(project / "experiment.yaml"), "--workers", "2")
    # past the first epoch's checkpoint (step 30), which the chief's agent sends once it settles
    live.script_pid_at("worker-0", lambda s: s.get("step", 0) >= 45)
    os.kill(live.script_pid_at("worker-1", lambda s: True), signal.SIGKILL)
    done = live.finish()
    assert done.returncode == 0, done.stdout + done.stderr
    log = live.log("worker-0").read_text()
    second_life = log[log.index("life 2") :]
    assert re.search(r"restored \S+/ckpt-\d+ at epoch \d+", second_life), log[-4000:]
    assert live.status("worker-1")["restarts"] >= 1
    metrics = live.metrics
    _the_kill_shows_as_a_restart(live, done, metrics)
    assert metrics["mode"] == "script" and metrics["workers"] == 2
    assert metrics["steps"] == 180, "6 epochs of 30 steps, the script's own count after its restore"
    assert set(metrics["scalars"]) == {"loss", "train_accuracy"}
    assert metrics["eval_accuracy"] is None, "the script reported no eval accuracy: none is made up"
    assert "train_accuracy" in done.stdout and "eval accuracy" not in done.stdout
    stored = {p.name for p in (live.store / "checkpoints" / "files").iterdir()}
    assert "checkpoint" in stored and any(re.fullmatch(r"ckpt-\d+\.index", n) for n in stored), stored
    assert not any("workertemp" in name for name in stored), "only the chief's checkpoint is the run's"
    state = re.search(
        r'model_checkpoint_path: "([^"]+)"', (live.store / "checkpoints" / "files" / "checkpoint").read_text()
    )
    assert state is not None
    assert sorted(stored) == sorted(["checkpoint", f"{state[1]}.index", f"{state[1]}.data-00000-of-00001"]), (
        "the guide keeps one checkpoint (max_to_keep=1): the store holds that one, as the script does"
    )
    assert metrics["scalars"]["train_accuracy"] > 0.7
    assert metrics["no_model"] == "found nothing, no SavedModel/.keras/.h5" and metrics["models"] == []
    latest = metrics["latest_checkpoint"]
    assert latest == state[1] and f"{latest}.index" in stored, (latest, stored)
    saved = "no model saved (found nothing, no SavedModel/.keras/.h5); its checkpoints at "
    assert f"{saved}{metrics['checkpoint']}, the latest {latest}" in done.stdout, done.stdout
    assert json.loads((live.store / "DONE").read_text())["reason"] == "no model saved"
    assert alive_node_pids(str(live.run_dir)) == []
    bundle = json.loads((live.run_dir / "manifest.json").read_text())["bundle"]
    assert sorted(bundle["files"]) == ["digits.npz", "experiment.yaml", "train.py"], "home is never packed"


def test_the_owner_killed_after_its_peer_finished_restarts_with_it_and_the_run_ends_done(
    tmp_path: Path,
) -> None:
    """bench_restarts seed 59, kill 18: worker-1's script exited 0, then the owner's was killed while it
    still worked (saving a model, here a minute's sleep on its first life). The owner's new life waited
    for a peer that had left, until stall_timeout. The finished worker now stays a member until the run
    ends: it restarts with the owner, both restore the last checkpoint, and the run ends DONE."""
    once = tmp_path / "saved-once"  # outside the node's work: each life unpacks its code afresh
    slow_save = f'if [ "$DLINFRA_NODE" = worker-0 ] && [ ! -e {once} ]; then touch {once}; sleep 120; fi'
    project = user_project(
        tmp_path,
        "mwms_custom_loop.py",
        "name: owner-late\nstrategy: multi_worker_mirrored\ncluster: {stall_timeout: 90}\ntraining:\n"
        "  command: [bash, -c, 'python train.py --data digits.npz --checkpoint_dir $DLINFRA_CHECKPOINT_DIR"
        f" --epochs 2 --steps_per_epoch 10 && {slow_save}']\n",
    )
    digits_beside(project)
    live = start_deploy(tmp_path, str(project / "experiment.yaml"), "--workers", "2")
    # worker-1 stays, and the owner's python has ended: its "save" has begun (a kill before that, under
    # load in the full tier, left the first life's sleep to the second, which then stalled as it should)
    deadline = time.monotonic() + 300
    while not once.exists() or (
        (read_state(state_file(live.run_dir / "work" / "worker-1")) or {}).get("state") != "done"
    ):
        assert time.monotonic() < deadline and live.proc.poll() is None, "the owner never began its save"
        time.sleep(0.1)
    os.kill(live.script_pid_at("worker-0", lambda s: True), signal.SIGKILL)
    done = live.finish()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "staying with the cluster until the run ends" in live.log("worker-1").read_text()
    causes = {(r["node"], r["cause"]) for r in live.metrics["restarts"]}
    assert causes == {
        ("worker-0", "killed by signal 9"),
        ("worker-1", "restarted with the cluster after worker-0"),
    }
    assert json.loads((live.store / "DONE").read_text())["node"] == "worker-0"
    assert alive_node_pids(str(live.run_dir)) == []


def _the_kill_shows_as_a_restart(live: Live, done: subprocess.CompletedProcess[str], metrics: Any) -> None:
    """worker-1's kill -9 is a restart everywhere a user looks: the deploy output as it happened, the
    result table, metrics.json, the DONE marker, `runs` and `show`, with where it resumed and its cost."""
    killed = [r for r in metrics["restarts"] if r["node"] == "worker-1"]
    assert [r["cause"] for r in killed] == ["killed by signal 9"], metrics["restarts"]
    assert killed[0]["resumed_at"] > killed[0]["failed_at"] and killed[0]["from_scratch"] is None, killed
    said = re.search(
        r"\nworker-1 restarted \(killed by signal 9\) at [\d:]{8}; resumed [^;\n]+; ([\d.]+) s lost",
        done.stdout,
    )
    assert said, done.stdout[-4000:]
    assert float(said.group(1)) == pytest.approx(killed[0]["resumed_at"] - killed[0]["failed_at"], abs=0.06)
    row = re.search(r"restarts\W+(\d) \((worker-0, )?worker-1\)", done.stdout)
    assert row and int(row.group(1)) == len(metrics["restarts"]), done.stdout[-3000:]
    assert said.start() < row.start(), "said as it happened, before the result"
    marker = json.loads((live.store / "DONE").read_text())
    assert marker["restarts"] == metrics["restarts"]
    env = {**os.environ, "DLINFRA_HOME": str(live.home)}
    [listed] = json.loads(run_cli("runs", "--json", env=env, check=True).stdout)
    assert listed["restarts"] == len(metrics["restarts"])
    shown = json.loads(run_cli("show", live.run_dir.name, "--json", env=env, check=True).stdout)
    assert any(line.startswith("worker-1 restarted (killed by signal 9)") for line in shown["restarts"]), (
        shown
    )


# tf-keras: what TensorFlow's guides were written for. `tensorflow` (not -cpu) is what tf-keras
# requires, and since 2.16 it brings no tensorboard of its own


@pytest.mark.parametrize(
    ("keras", "ps"),
    [
        # Keras 3's layers cannot train a ShardedVariable (no `handle`): one ps, where the guide's
        # partitioner makes no shards
        ("keras 3", 1),
        ("tf-keras", 2),  # the embedding sharded over both parameter servers
    ],
)
def test_a_coordinator_adapted_from_the_ps_guide_goes_on_when_a_worker_killed_mid_run_rejoins(
    tmp_path: Path, keras: str, ps: int
) -> None:
    """TensorFlow's parameter-server guide (coordinator, partitioner, StringLookup and Embedding);
    worker 1's script killed with kill -9 after epoch 2 of 12: its node restarts, the coordinator
    re-runs what it had in flight, and the run ends DONE, saying the guide saved no model and wrote no
    checkpoint."""
    legacy = keras == "tf-keras"
    project = user_project(
        tmp_path,
        "ps_coordinator.py",
        f"name: guide-ps\nstrategy: parameter_server\ncluster: {{ps: {{count: {ps}}}}}\ntraining:\n"
        + (TF_KERAS if legacy else "")
        + f"  command: [{LEGACY if legacy else ''}python, train.py, --epochs, 12]\n",
    )
    live = start_deploy(tmp_path, str(project / "experiment.yaml"), "--workers", "2")
    chief_log = live.log("chief-0")
    pid = live.script_pid_at(
        "worker-1", lambda s: chief_log.exists() and "Finished epoch 2," in chief_log.read_text()
    )
    os.kill(pid, signal.SIGKILL)
    done = live.finish()
    assert done.returncode == 0, done.stdout + done.stderr
    assert live.status("worker-1")["restarts"] == 1
    metrics = live.metrics
    assert metrics["steps"] is None and metrics["scalars"] == {}
    assert "unknown (the script reported none" in done.stdout
    log = chief_log.read_text()
    accuracy = [float(a) for a in re.findall(r"Finished epoch \d+, accuracy is (\d+\.\d+)", log)]
    assert len(accuracy) == 12 and accuracy[-1] > 0.8, log[-3000:]
    assert live.metrics["no_model"] and live.metrics["checkpoint"] is None
    assert "model: none: no model saved (found nothing" in done.stdout
    assert "no checkpoint either (nothing in $DLINFRA_CHECKPOINT_DIR)" in done.stdout
    for node in ("worker-0", "worker-1", *(f"ps-{i}" for i in range(ps))):  # served until the chief was done
        assert live.status(node)["state"] == "done"
    assert alive_node_pids(str(live.run_dir)) == []


def test_a_keras_fit_script_reports_through_tensorboard_and_fails_under_require_model(
    tmp_path: Path,
) -> None:
    """The guide's main.py saves no model (its BackupAndRestore deletes its backup once fit ends):
    with training.require_model it trains, its progress read from its TensorBoard scalars, and ends
    FAILED with the verdict 'no model', naming what it found; what it trained is in metrics.json."""
    project = user_project(
        tmp_path,
        "mwms_keras_fit.py",
        "name: guide-fit\nstrategy: multi_worker_mirrored\ntraining:\n"
        + TF_KERAS
        + "  require_model: true\n"
        + f"  command: [{LEGACY}python, train.py, --data, digits.npz,\n"
        "            --backup_dir, $DLINFRA_CHECKPOINT_DIR, --tensorboard_dir, $DLINFRA_TENSORBOARD_DIR]\n",
    )
    digits_beside(project)
    run = deploy_project(tmp_path, project, "--workers", "2")
    failed = failed_marker(run)
    assert failed["verdict"] == "no model" and failed["node"] == "worker-0", failed
    assert "found nothing, no SavedModel/.keras/.h5" in str(failed["error"]), failed
    assert "training.require_model is true" in str(failed["error"])
    assert "run " in run.result.stderr and "no model" in run.result.stderr
    metrics = run.metrics
    assert metrics["progress"] == "tensorboard" and metrics["steps"] == 2, "Keras logs epochs 0, 1, 2"
    assert metrics["scalars"]["train/epoch_accuracy"] > 0.7
    assert any((run.store / "tensorboard" / "train").glob("events.out.tfevents.*"))


def test_an_estimator_program_runs_unchanged_on_its_own_tensorflow_2_15(tmp_path: Path) -> None:
    """The workload this project was first described with: a `train_and_evaluate` Estimator cluster
    (chief, workers, a ps). tf.estimator shipped last with TensorFlow 2.15: the run's lock holds the
    script's pin and no TensorFlow of dlinfra's, and the nodes' agents import none."""
    project = user_project(
        tmp_path,
        "estimator_train_and_evaluate.py",
        "name: estimator\nstrategy: parameter_server\ntraining:\n"
        "  requirements: [tensorflow-cpu==2.15.1]\n"
        "  command: [python, train.py, --data, digits.npz, --model_dir, $DLINFRA_CHECKPOINT_DIR,\n"
        "            --export_dir, $DLINFRA_MODEL_DIR]\n",
    )
    digits_beside(project)
    run = deploy_project(tmp_path, project, "--workers", "2")
    assert run.result.returncode == 0, run.result.stdout[-3000:] + run.result.stderr[-3000:]
    packages = run.manifest["environment"]["cpu"]["packages"]
    assert packages["tensorflow-cpu"] == "2.15.1" and packages["keras"].startswith("2.15.")
    assert "scikit-learn" not in packages, "nothing of dlinfra's train extra"
    # the record says what the nodes ran (issue 56: it said the CLI's TensorFlow 2.21.0)
    versions = run.manifest["versions"]
    assert versions["source"] == "nodes" and versions["tensorflow"] == "2.15.1", versions
    assert versions["keras"] == packages["keras"] and versions["numpy"] == packages["numpy"], versions
    assert versions["lock"] == run.manifest["environment"]["cpu"]["sha256"], versions
    assert versions["python"].startswith("3.") and run.manifest["node_versions"] == {}  # all agree
    env = dict(os.environ, DLINFRA_HOME=str(run.home))
    shown = run_cli("show", run.run_id, env=env).stdout
    assert "tensorflow 2.15.1, keras 2.15." in shown and "(what the nodes ran)" in shown, shown
    chief_log = (run.run_dir / "logs" / "chief-0.log").read_text()
    accuracy = float(re.search(r"'accuracy': ([\d.]+)", chief_log).group(1))  # type: ignore[union-attr]
    assert accuracy > 0.8, chief_log[-3000:]
    [export] = [p.parent for p in (run.store / "model").rglob("saved_model.pb")]
    # found in its timestamped directory, read with the run's TensorFlow 2.15 protobufs
    assert run.metrics["models"] == [f"SavedModel {export.relative_to(run.store / 'model')}"]
    assert run.metrics["no_model"] is None and "no model" not in run.result.stdout
    code = (
        "m = tf.saved_model.load(sys.argv[1])\n"
        "d = np.load(sys.argv[2])\n"
        "x = tf.constant(d['x_test'].reshape(-1, 64).astype('float32') / 16.0)\n"
        "ids = m.signatures['predict'](pixels=x)['class_ids'].numpy()[:, 0]\n"
        "print((ids == d['y_test']).mean())\n"
    )
    assert float(_in_plain_tensorflow(code, str(export), str(project / "digits.npz"))) > 0.8
    assert alive_node_pids(run.run_id) == []


def test_a_typical_keras_regression_runs_on_one_node_with_its_own_metric(tmp_path: Path) -> None:
    """A one-machine program (no strategy) on a one-node cluster: its MAE, from the scalars Keras
    writes for TensorBoard, names the result; no accuracy is made up for it."""
    project = user_project(
        tmp_path,
        "keras_regression.py",
        "name: regression\nstrategy: multi_worker_mirrored\ncluster: {workers: {count: 1}}\ntraining:\n"
        "  command: [python, train.py, --model_dir, $DLINFRA_MODEL_DIR, --tensorboard_dir,\n"
        "            $DLINFRA_TENSORBOARD_DIR]\n"
        "  requirements: [scikit-learn]  # the script loads its data with it (dlinfra adds none)\n",
    )
    run = deploy_project(tmp_path, project)
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    scalars = run.metrics["scalars"]
    assert run.metrics["models"] == [".keras model.keras"] and run.metrics["no_model"] is None
    assert run.metrics["progress"] == "tensorboard" and run.metrics["eval_accuracy"] is None
    assert scalars["validation/epoch_mae"] < 55, scalars  # predicting the mean: 66
    assert "validation/epoch_mae" in run.result.stdout and "accuracy" not in run.result.stdout
    # the command, a value a user copies, on a line of its own, whole (a table cell would wrap it)
    whole = "command: python train.py --model_dir '$DLINFRA_MODEL_DIR'"
    whole += " --tensorboard_dir '$DLINFRA_TENSORBOARD_DIR'"
    assert whole in run.result.stdout.splitlines(), run.result.stdout
    code = (
        "from sklearn.datasets import load_diabetes\n"
        "x, y = load_diabetes(return_X_y=True)\n"
        "p = tf.keras.models.load_model(sys.argv[1]).predict(x.astype('float32'), verbose=0)[:, 0]\n"
        "print(np.abs(p - y).mean())\n"
    )
    assert float(_in_plain_tensorflow(code, str(run.store / "model" / "model.keras"))) < 55


@pytest.mark.full  # the guide on emulated instances; script mode and aws each keep theirs in the default tier
@pytest.mark.terraform
def test_the_adapted_mwms_guide_runs_on_emulated_aws_instances_with_its_results_in_s3(
    tmp_path: Path, moto_endpoint: str, tf_cli_config: Path
) -> None:
    """The aws target against the emulator: each instance boots from its user-data (the command
    travels in its node config), and the script's checkpoints land in S3 (like the guide, it saves
    no model). The guide's command is wrapped by a hostile one (issue 55, classes 1 and 4): a link
    out of the model directory and a daemon on each instance, neither of which may outlive or leak
    out of the run."""
    outside, pids = tmp_path / "outside.txt", tmp_path / "daemons"
    outside.write_text("an instance's own file")
    pids.mkdir()
    project = user_project(
        tmp_path,
        "mwms_custom_loop.py",
        "name: guide-aws\nstrategy: multi_worker_mirrored\ntraining:\n"
        f"  command: [python, leave_daemon.py, {pids}, {outside}, python, train.py, --data, digits.npz,\n"
        "            --checkpoint_dir, $DLINFRA_CHECKPOINT_DIR, --report]\n",
    )
    shutil.copy(SCRIPTS / "leave_daemon.py", project)
    digits_beside(project)
    bucket = "dlinfra-scripts"
    aws = aws_emulation(moto_endpoint, tf_cli_config, tmp_path / "home", bucket)
    result = run_cli(
        "deploy", str(project / "experiment.yaml"), "--target", "aws", "--workers", "2", "--yes",
        "--emulate-instances", *aws["args"], env=aws["env"], cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [run_dir] = (tmp_path / "home" / "runs").iterdir()
    s3, prefix = aws_client(moto_endpoint, "s3"), f"runs/{run_dir.name}/"
    keys = {
        o["Key"][len(prefix) :]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    }
    assert {"DONE", "metrics.json", "checkpoints/files/checkpoint"} <= keys, keys
    metrics = json.loads(s3.get_object(Bucket=bucket, Key=prefix + "metrics.json")["Body"].read())
    assert metrics["mode"] == "script" and metrics["steps"] == 60
    assert metrics["no_model"] == "found nothing, no SavedModel/.keras/.h5", "a link out is not a model"
    assert metrics["checkpoint"] == f"s3://{bucket}/{prefix}checkpoints/files"
    daemons = {p.name: int(p.read_text()) for p in pids.iterdir()}
    assert sorted(daemons) == ["worker-0", "worker-1"]
    alive = [pid for name, pid in daemons.items() if _runs(pid, f"daemon-of-{name}")]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert alive == [], "a daemon outlived its emulated instance's run"
    assert "model/leak-worker-0" not in keys
    assert metrics["outputs_refused"] == [
        "DLINFRA_MODEL_DIR: 'leak-worker-0' is a link out of it: refused, not uploaded"
    ]


def _runs(pid: int, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
