"""The main job on the embedded default: real TF clusters as local processes (issue 3 acceptance)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlinfra.render import node_config_from_user_data
from support import alive_node_pids, fresh_process_accuracy, run_cli

from .conftest import Deployed

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = ["chief-0", "ps-0", "worker-0", "worker-1", "worker-2"]


@pytest.mark.parametrize("run_name", ["ps_run", "mirrored_run"])
def test_deploy_trains_to_accuracy_and_exits_0(run_name: str, request: pytest.FixtureRequest) -> None:
    run: Deployed = request.getfixturevalue(run_name)
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    assert run.metrics["eval_accuracy"] >= 0.90
    assert (run.store / "DONE").is_file()
    assert run.manifest["status"] == "DONE"
    # the result table: the thesis' columns
    for column in (
        "global steps/s",
        "examples/s",
        "total time",
        "eval accuracy",
        "command to first step",
        "model",
    ):
        assert column in run.result.stdout


@pytest.mark.parametrize("run_name", ["ps_run", "mirrored_run"])
def test_exported_model_reproduces_accuracy_in_a_fresh_process(
    run_name: str, request: pytest.FixtureRequest
) -> None:
    run: Deployed = request.getfixturevalue(run_name)
    accuracy = fresh_process_accuracy(str(run.store / "model" / "saved_model"))
    assert abs(accuracy - run.metrics["eval_accuracy"]) <= 0.01


def test_ps_run_has_the_planned_cluster_shape(ps_run: Deployed) -> None:
    assert ps_run.manifest["nodes"] == NODES
    assert ps_run.metrics["workers"] == 3 and ps_run.metrics["ps"] == 1
    assert ps_run.metrics["steps"] == ps_run.metrics["total_steps"] == 600
    for name in NODES:
        status = json.loads((ps_run.store / "status" / f"{name}.json").read_text())
        assert status["state"] == "done", (name, status)


def test_mirrored_run_has_workers_only(mirrored_run: Deployed) -> None:
    assert mirrored_run.manifest["nodes"] == ["worker-0", "worker-1"]
    assert mirrored_run.metrics["strategy"] == "multi_worker_mirrored"


def test_runs_state_their_replicas_global_batch_and_lr_rule(ps_run: Deployed, mirrored_run: Deployed) -> None:
    ps, mirrored = ps_run.metrics, mirrored_run.metrics
    assert (ps["replicas"], ps["global_batch"], ps["lr_scaling"]) == (
        3,
        64,
        "none (async: one batch per update)",
    )
    assert (mirrored["replicas"], mirrored["global_batch"]) == (2, 128), "one replica per CPU worker"
    assert mirrored["learning_rate"] == 0.003 and mirrored["lr_scaling"] == "none (learning_rate as given)"
    assert "replicas · global batch" in mirrored_run.result.stdout


def test_async_updates_are_counted_exactly(ps_run: Deployed, mirrored_run: Deployed) -> None:
    """Three workers update the ps at once. Keras's own step counter (a read, then an assign) lost
    about one increment in three to such races, so the chief handed out more batches than the
    experiment's steps; the count the loop uses now is one atomic op on the ps."""
    metrics = ps_run.metrics
    assert metrics["steps"] == metrics["total_steps"] == 600
    assert metrics["steps_scheduled"] == 600, "every batch handed to a worker was counted once"
    assert metrics["steps_per_call"] == {"10": 600}, "the default: 10 steps per remote call"
    assert mirrored_run.metrics["steps_per_call"] == {}, "mirrored calls are log_every steps"


@pytest.mark.parametrize("run_name", ["ps_run", "mirrored_run"])
def test_every_progress_report_is_of_steps_done_since_the_last(
    run_name: str, request: pytest.FixtureRequest
) -> None:
    """A chunk's last call under parameter servers can end before calls fetched earlier: its count then
    says nothing new, and a report of it put a step twice in the log and 0 examples/s in the series."""
    series = request.getfixturevalue(run_name).metrics["examples_per_sec_series"]
    steps = [step for _, step, _ in series]
    assert steps == sorted(set(steps)) and steps[-1] == 600, steps
    assert all(rate > 0 for _, _, rate in series), series


def test_every_node_records_the_devices_it_trained_on(ps_run: Deployed) -> None:
    devices = ps_run.manifest["devices"]
    assert sorted(devices) == NODES
    assert all(names == ["CPU:0"] for names in devices.values()), devices  # this machine has no GPU


def test_each_node_booted_from_its_own_user_data(ps_run: Deployed) -> None:
    for name in NODES:
        user_data = (ps_run.run_dir / "user-data" / f"{name}.yaml").read_text()
        booted = json.loads((ps_run.run_dir / "nodes" / f"{name}.json").read_text())
        assert node_config_from_user_data(user_data).model_dump(mode="json") == booted


def test_store_holds_the_per_run_layout(ps_run: Deployed) -> None:
    store = ps_run.store
    for name in NODES:
        assert (store / "status" / f"{name}.json").is_file()
        assert (store / "logs" / f"{name}.log").stat().st_size > 0
    pointer = json.loads((store / "checkpoints" / "latest.json").read_text())
    assert pointer["step"] == 600
    assert all((store / "checkpoints" / f).is_file() for f in pointer["files"])
    assert (store / "model" / "model.keras").is_file()
    assert (store / "model" / "saved_model" / "saved_model.pb").is_file()
    assert list((store / "tensorboard").glob("events.out.tfevents.*"))


def test_tensorboard_events_carry_the_loss(ps_run: Deployed) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(ps_run.store / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert {"loss", "examples_per_sec", "eval_accuracy"} <= set(tags)
    losses = acc.Tensors("loss")
    assert len(losses) >= 10
    # Each segment between checkpoints (200 steps) ends on its exact count, whatever order the
    # workers' last calls ended in; the last report is the run's final step.
    assert {200, 400, 600} <= {event.step for event in losses}
    assert losses[-1].step == 600


@pytest.mark.parametrize("run_name", ["ps_run", "mirrored_run"])
def test_no_node_process_outlives_a_successful_deploy(run_name: str, request: pytest.FixtureRequest) -> None:
    run: Deployed = request.getfixturevalue(run_name)
    assert run.manifest["pids"], "the launcher records its node pids"
    assert alive_node_pids(run.run_id) == []


def test_status_show_runs_and_logs_read_the_run(ps_run: Deployed) -> None:
    env = {"DLINFRA_HOME": str(ps_run.home), "PATH": "/usr/bin:/bin"}
    status = json.loads(run_cli("status", "--json", env=env, check=True).stdout)
    assert status["status"] == "DONE"
    assert status["nodes"]["chief-0"]["step"] == 600
    assert set(status["nodes"]) == set(NODES)
    show = json.loads(run_cli("show", ps_run.run_id, "--json", env=env, check=True).stdout)
    assert show["metrics"]["eval_accuracy"] == ps_run.metrics["eval_accuracy"]
    assert show["model"].endswith("/model")
    runs = json.loads(run_cli("runs", "--json", env=env, check=True).stdout)
    assert runs[0]["run_id"] == ps_run.run_id and runs[0]["status"] == "DONE"
    logs = run_cli("logs", ps_run.run_id, "--node", "chief-0", env=env, check=True).stdout
    assert "done: step 600" in logs
    destroyed = run_cli("destroy", ps_run.run_id, env=env, check=True).stdout
    assert "0 leftover node process groups stopped" in destroyed
    missing = run_cli("show", "no-such-run", env=env)
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_a_ps_cluster_confined_to_one_cpu_trains(tmp_path: Path) -> None:
    """Stands in for 1-vCPU instances (and a container limited to one CPU): every node of a ps run
    may run on one CPU only (`taskset`). TensorFlow would size the ps's inter-op pool to one thread,
    which blocks serving one request while the next waits: step 0 forever. Bounded by the stall
    timeout, so a regression fails in a minute instead of hanging."""
    cpu = str(min(os.sched_getaffinity(0)))
    pinned = ["taskset", "-c", cpu, sys.executable, "-m", "dlinfra", "deploy"]
    args = ["--workers", "1", "--strategy", "parameter_server", "--steps", "20"]
    result = subprocess.run(
        [*pinned, *args, "--set", "cluster.stall_timeout=60"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, DLINFRA_HOME=str(tmp_path / "home")),
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = (tmp_path / "home" / "runs").iterdir()
    for node in ("chief-0", "ps-0", "worker-0"):
        log = (run_dir / "logs" / f"{node}.log").read_text()
        assert "inter-op threads 2" in log, log[-2000:]


@pytest.mark.parametrize("run_name", ["ps_run", "mirrored_run"])
def test_the_result_says_where_the_seconds_to_the_first_step_went(
    run_name: str, request: pytest.FixtureRequest
) -> None:
    run: Deployed = request.getfixturevalue(run_name)
    line = next(row for row in run.result.stdout.splitlines() if "startup (s after the command)" in row)
    shown = run_cli("show", run.run_id, env=dict(os.environ, DLINFRA_HOME=str(run.home)))
    startup = next(row for row in shown.stdout.splitlines() if row.startswith("startup:"))
    phases = [part.rsplit(" ", 1) for part in startup.removeprefix("startup: ").split(" · ")]
    names = [name for name, _ in phases]
    # every phase of the training node, in the order they happen, on the command's clock
    own = [name for name in names if "(the last peer)" not in name]
    assert own == ["spawned", "up", "tensorflow", "peers", "program", "first step"], startup
    assert any(name.endswith(": tensorflow (the last peer)") for name in names), startup
    seconds = [float(s) for _, s in phases]
    assert seconds == sorted(seconds) and seconds[0] > 0 and seconds[-1] < 120
    assert "spawned" in line  # the deploy's own result table shows it too
    first_step = run.metrics["first_step_at"] - run.manifest["command_started"]
    assert abs(first_step - seconds[-1]) <= 0.051, (first_step, startup)  # shown to 0.1 s


def test_ps_servers_load_only_tensorflows_server(ps_run: Deployed) -> None:
    """The workers and the ps of a CPU ps run serve without TensorFlow's API, Keras or scikit-learn
    (node.serving): their startup reaches `tensorflow` (the server up) long before the chief's."""
    for name in ("worker-0", "ps-0"):
        status = json.loads((ps_run.store / "status" / f"{name}.json").read_text())
        assert status["devices"] == ["CPU:0"] and set(status["phases"]) >= {"spawned", "up", "tensorflow"}
        log = (ps_run.store / "logs" / f"{name}.log").read_text()
        assert f"serving {name.split('-')[0]}" in log and "TensorFlow's server alone" in log
