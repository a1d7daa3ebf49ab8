"""User entrypoints, the S3 store (real HTTP to a moto server), failures and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import FAKE_CREDS, alive_node_pids, s3_client

from .conftest import deploy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DATA = Path(__file__).parent.parent / "data"


def _experiment(tmp: Path, body: str) -> Path:
    spec = tmp / "experiment.yaml"
    spec.write_text(body)
    return spec


def test_user_entrypoint_trains_unchanged_on_2_workers(tmp_path: Path) -> None:
    workers = 2
    (tmp_path / "user_program.py").write_text((DATA / "user_program.py").read_text())
    spec = _experiment(
        tmp_path, "name: user-mlp\ntraining:\n  entrypoint: user_program.py:build\n  steps: 300\n"
    )
    run = deploy(tmp_path, str(spec), "--workers", str(workers))
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    assert run.metrics["workers"] == workers
    assert run.metrics["eval_accuracy"] >= 0.85
    assert alive_node_pids(run.run_id) == []


def test_s3_store_receives_model_metrics_checkpoints_and_logs(tmp_path: Path, moto_endpoint: str) -> None:
    s3 = s3_client(moto_endpoint)
    s3.create_bucket(Bucket="dlinfra-results")
    spec = _experiment(
        tmp_path,
        f"name: digits-s3\nstorage:\n  url: s3://dlinfra-results/team-a\n  endpoint_url: {moto_endpoint}\n"
        "training:\n  steps: 300\n  checkpoint_every: 100\n",
    )
    run = deploy(tmp_path, str(spec), "--workers", "2", env=FAKE_CREDS)
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    prefix = f"team-a/{run.run_id}/"
    keys = {
        o["Key"][len(prefix) :]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="dlinfra-results", Prefix=prefix)
        for o in page.get("Contents", [])
    }
    assert {"DONE", "metrics.json", "model/model.keras", "model/saved_model/saved_model.pb"} <= keys
    assert {f"logs/{n}.log" for n in ("chief-0", "ps-0", "worker-0", "worker-1")} <= keys
    assert {f"status/{n}.json" for n in ("chief-0", "ps-0", "worker-0", "worker-1")} <= keys
    pointer = json.loads(
        s3.get_object(Bucket="dlinfra-results", Key=prefix + "checkpoints/latest.json")["Body"].read()
    )
    assert pointer["step"] == 300
    assert {f"checkpoints/{f}" for f in pointer["files"]} <= keys
    assert any(k.startswith("tensorboard/events.out.tfevents") for k in keys)
    metrics = json.loads(s3.get_object(Bucket="dlinfra-results", Key=prefix + "metrics.json")["Body"].read())
    assert metrics["eval_accuracy"] >= 0.90
    assert metrics["model_uri"] == f"s3://dlinfra-results/{prefix}model"
    assert not (run.run_dir / "store").exists(), "an s3 run keeps nothing in a local store"


def test_failing_user_code_fails_the_run_shows_the_traceback_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "broken_program.py").write_text((DATA / "broken_program.py").read_text())
    spec = _experiment(tmp_path, "name: broken\ntraining:\n  entrypoint: broken_program.py:build\n")
    started = time.monotonic()
    run = deploy(tmp_path, str(spec), "--workers", "2")
    assert run.result.returncode == 1
    assert time.monotonic() - started < 120
    assert "FAILED" in run.result.stderr
    assert "node chief-0" in run.result.stderr
    assert "user bug: no such column 'pixels'" in run.result.stderr
    assert "Traceback" in run.result.stderr, "the failing node's own traceback is shown"
    assert run.manifest["status"] == "FAILED"
    assert alive_node_pids(run.run_id) == []


def test_ctrl_c_stops_the_run_and_every_node(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = dict(os.environ, DLINFRA_HOME=str(home))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlinfra", "deploy", "--workers", "2", "--steps", "100000"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as a shell's foreground job: a group (and here a session) of its own
    )
    try:
        deadline = time.monotonic() + 180
        status = None
        while time.monotonic() < deadline:
            found = list(home.glob("runs/*/store/status/chief-0.json"))
            status = json.loads(found[0].read_text()) if found else None
            if status and status.get("step", 0) > 0:
                break
            time.sleep(0.5)
        assert status and status["step"] > 0, "training never started"
        run_dir = found[0].parents[2]
        nodes = alive_node_pids(run_dir.name)
        assert len(nodes) == 2 * 4  # each node: its beacon and its trainer
        # Each in a group of its own, all in the CLI's session: the kernel's autogroup scheduler
        # shares the CPU per session, and a session per node cost throughput (BENCHMARKS.md)
        assert {os.getsid(pid) for pid in nodes} == {proc.pid}
        assert all(os.getpgid(pid) == pid for pid in nodes)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: its foreground group
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted" in stderr
    assert "Traceback" not in stderr
    assert alive_node_pids(run_dir.name) == []
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "STOPPED"
    assert json.loads((run_dir / "store" / "STOPPED").read_text())["reason"].startswith("interrupted")
