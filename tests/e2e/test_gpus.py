"""Nodes prove the devices they train on: a GPU node TensorFlow sees no GPU on fails at once, and on
a machine with a GPU the worker really trains on it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from e2e.conftest import deploy
from support import alive_node_pids

pytestmark = pytest.mark.e2e


def test_a_worker_asking_for_a_gpu_tensorflow_cannot_see_fails_the_run_at_once(tmp_path: Path) -> None:
    """This machine has no GPU (and CUDA_VISIBLE_DEVICES="" hides any elsewhere). The failure must
    come from the device check, not a timeout: every timeout here is longer than the test allows."""
    run = deploy(
        tmp_path,
        "--strategy",  # one node, the worker that asks for the GPU: no chief or ps to start and stop
        "multi_worker_mirrored",
        "--workers",
        "1",
        "--set",
        "cluster.workers.gpus=1",
        "--set",
        "cluster.startup_timeout=600",
        "--set",
        "cluster.heartbeat_timeout=600",
        env={"CUDA_VISIBLE_DEVICES": ""},
        timeout=240,
    )
    assert run.result.returncode == 1, run.result.stdout + run.result.stderr
    marker = json.loads((run.store / "FAILED").read_text())
    assert marker["node"] == "worker-0" and marker["verdict"] == "devices"
    assert "worker-0 (this machine) asked for 1 GPU and TensorFlow sees 0" in marker["error"]
    assert "Likely cause:" in marker["error"]
    assert "asked for 1 GPU and TensorFlow sees 0" in run.result.stderr
    assert "[train-gpu]" in run.result.stderr or "driver" in run.result.stderr, "the fix is shown whole"
    worker = json.loads((run.store / "status" / "worker-0.json").read_text())
    assert worker["state"] == "failed" and worker["restarts"] == 0, "a final exit: no restart loop"
    assert run.manifest["devices"]["worker-0"] == ["CPU:0"]
    assert alive_node_pids(run.run_id) == []


@pytest.mark.gpu
def test_a_gpu_worker_trains_on_its_gpu(tmp_path: Path) -> None:
    """Needs a GPU TensorFlow can see and the GPU build (docs/gpus.md, "What a node installs");
    deselected elsewhere."""
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "", "this test needs a visible GPU"
    run = deploy(tmp_path, "--workers", "1", "--steps", "100", "--set", "cluster.workers.gpus=1")
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    assert run.manifest["devices"]["worker-0"][0].startswith("GPU:0 "), run.manifest["devices"]
    assert run.manifest["devices"]["chief-0"] == ["CPU:0"], "CPU nodes leave the GPU to the trainer"
    assert run.metrics["eval_accuracy"] > 0.8
