"""The widened Program contract on real local clusters: a regression that reports its own metric and
no accuracy, a lookup table and an embedding split over two parameter servers, and a program refused
on its first batch before the cluster trains."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_diabetes

from support import alive_node_pids, run_cli

from .conftest import Deployed, deploy, start_deploy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROGRAMS = Path(__file__).parents[1] / "data" / "contract_programs.py"


def _project(tmp: Path, function: str, steps: int) -> Path:
    shutil.copy(PROGRAMS, tmp / "contract_programs.py")
    spec = tmp / "experiment.yaml"
    spec.write_text(
        f"name: {function.replace('_', '-')}\n"
        f"training:\n  entrypoint: contract_programs.py:{function}\n  steps: {steps}\n  batch_size: 32\n"
    )
    return spec


def _deploy(tmp: Path, function: str, *args: str, steps: int = 400) -> Deployed:
    return deploy(tmp, str(_project(tmp, function, steps)), *args)


def test_a_regression_through_the_contract_reports_mae_and_no_accuracy(tmp_path: Path) -> None:
    # parameter servers train through the same objective: the lookup-table tests below run under them
    run = _deploy(tmp_path, "regression", "--workers", "2", "--strategy", "multi_worker_mirrored", steps=600)
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    metrics = run.metrics
    assert metrics["eval_accuracy"] is None
    assert set(metrics["scalars"]) == {"eval_loss", "eval_mae"}
    assert (metrics["loss"], metrics["optimizer"]) == ("mse", "Adam (Program.optimizer)")
    table = run.result.stdout
    assert "eval mae" in table and "eval loss" in table and "accuracy" not in table
    assert "the optimizer's schedule" in table
    listed = run_cli("runs", "--json", env={**os.environ, "DLINFRA_HOME": str(run.home)}, cwd=tmp_path)
    assert json.loads(listed.stdout)[0]["eval_accuracy"] is None

    y = load_diabetes().target
    guessing_the_mean = float(np.abs(y[380:] - y[:380].mean()).mean())
    assert metrics["scalars"]["eval_mae"] < 0.85 * guessing_the_mean
    served = tf.saved_model.load(str(run.store / "model" / "saved_model"))
    x = load_diabetes().data.astype("float32")
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    predicted = np.asarray(served.serve(x[380:]))[:, 0]
    assert float(np.abs(predicted - y[380:]).mean()) == pytest.approx(
        metrics["scalars"]["eval_mae"], rel=1e-3
    )
    assert alive_node_pids(run.run_id) == []


def test_unused_compile_settings_are_named_once_in_the_deploys_output(
    tmp_path: Path,
) -> None:
    """The deploy's output names the compile() settings the loop does not use, once for the run."""
    run = _deploy(tmp_path, "unused_compile_settings", "--workers", "2", steps=100)
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    said = "warning: compile() settings dlinfra's loop does not use, without effect on this run: "
    assert run.result.stderr.count(said + "loss_weights, run_eagerly") == 1, run.result.stderr
    assert run.metrics["optimizer"] == "Adam (the model's compile())"
    assert alive_node_pids(run.run_id) == []


def test_a_program_its_loss_cannot_fit_is_refused_before_the_cluster_trains(tmp_path: Path) -> None:
    run = _deploy(tmp_path, "regression_without_a_loss", "--workers", "1")
    assert run.result.returncode == 1, run.result.stdout + run.result.stderr
    marker = json.loads((run.store / "FAILED").read_text())
    assert marker["verdict"] == "program" and marker["node"] == "chief-0"
    assert "Program.loss" in marker["error"] and len(marker["error"]) < 1000
    assert "Program.loss" in run.result.stderr
    assert not (run.store / "metrics.json").exists()
    chief = (run.store / "logs" / "chief-0.log").read_text()
    assert not re.search(r"step \d+/400", chief), "no step was trained"
    assert alive_node_pids(run.run_id) == []


@pytest.mark.faults
def test_a_ps_holding_a_shard_killed_mid_run_resumes_from_the_sharded_checkpoint(tmp_path: Path) -> None:
    """A lookup table made in Program.setup and an embedding split over two parameter servers train;
    kill -9 of the ps holding one of the embedding's shards: it restarts, every life of the chief
    splits the embedding again and resumes from the sharded checkpoint, and the run ends DONE."""
    spec = _project(tmp_path, "lookup_table", 1000)
    live = start_deploy(
        tmp_path, str(spec), "--workers", "2", "--ps", "2", "--set", "training.checkpoint_every=100"
    )
    live.wait_for_step("chief-0", 450)
    os.killpg(live.trainer_pid("ps-1"), signal.SIGKILL)
    done = live.finish()
    assert done.returncode == 0, done.stdout + done.stderr
    assert live.status("ps-1")["restarts"] == 1
    chief = live.log("chief-0").read_text()
    assert re.search(r"resuming from checkpoint ckpt-\d+ \(step [1-9]\d*\)", chief), chief[-3000:]
    assert chief.count("split over the ps: embeddings (2 shards)") >= 2, "every life of the chief splits it"
    assert live.metrics["steps"] == 1000 and live.metrics["eval_accuracy"] > 0.6
    assert json.loads((live.store / "checkpoints" / "latest.json").read_text())["step"] == 1000
    assert alive_node_pids(live.run_dir.name) == []


def test_a_table_made_in_build_fails_with_where_it_belongs(tmp_path: Path) -> None:
    run = _deploy(tmp_path, "lookup_table_in_build", "--workers", "1", "--strategy", "parameter_server")
    assert run.result.returncode == 1, run.result.stdout + run.result.stderr
    marker = json.loads((run.store / "FAILED").read_text())
    assert "make lookup tables and preprocessing layers in Program.setup" in marker["error"], marker["error"]
    assert alive_node_pids(run.run_id) == []
