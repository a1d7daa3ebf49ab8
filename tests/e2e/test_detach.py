"""Detach and re-attach on real local clusters: `deploy --detach` returns with the nodes up, the
nodes finish the run with nobody watching, and `dlinfra watch` re-attaches (mid-run or after the
end) and ends with the result table."""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from support import alive_node_pids, cli_process, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _env(home: Path) -> dict[str, str]:
    return dict(os.environ, DLINFRA_HOME=str(home))


def _wait_for(path: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout:.0f}s"
        time.sleep(0.2)


def test_detached_run_finishes_alone_and_watch_prints_its_result(tmp_path: Path) -> None:
    home = tmp_path / "home"
    detached = run_cli("deploy", "--workers", "1", "--steps", "300", "--detach", env=_env(home), cwd=tmp_path)
    assert detached.returncode == 0, detached.stdout + detached.stderr
    [run_dir] = (home / "runs").iterdir()
    assert f"dlinfra watch {run_dir.name}" in detached.stdout
    # detach returns once the nodes are started, not at the end (an order, not a time: load-proof)
    assert not (run_dir / "store" / "DONE").exists()
    assert alive_node_pids(run_dir.name), "the nodes run on without the CLI"
    _wait_for(run_dir / "store" / "DONE")
    _wait_for(run_dir / "store" / "model" / "saved_model" / "saved_model.pb")
    deadline = time.monotonic() + 300
    while alive_node_pids(run_dir.name):  # servers see the marker and leave by themselves
        assert time.monotonic() < deadline, "nodes of a finished detached run are still running"
        time.sleep(0.5)
    listed = json.loads(run_cli("runs", "--json", env=_env(home), cwd=tmp_path).stdout)
    assert listed[0]["status"] == "DONE" and listed[0]["eval_accuracy"] >= 0.9
    watched = run_cli("watch", run_dir.name, env=_env(home), cwd=tmp_path)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert f"run {run_dir.name}: DONE" in watched.stdout and "eval accuracy" in watched.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "DONE" and manifest["metrics"]["eval_accuracy"] >= 0.9


def _watch(home: Path, tmp_path: Path, run_id: str) -> subprocess.Popen[str]:
    return cli_process("watch", run_id, env=_env(home), cwd=tmp_path)


def _owner(home: Path, tmp_path: Path, run_id: str) -> str | None:
    listed = run_cli("runs", "--json", env=_env(home), cwd=tmp_path)
    return next(r for r in json.loads(listed.stdout) if r["run_id"] == run_id)["owner"]


def test_watch_attached_mid_run_shows_progress_and_ctrl_c_only_stops_watching(tmp_path: Path) -> None:
    home = tmp_path / "home"
    detached = run_cli(
        "deploy", "--workers", "1", "--steps", "4000", "--detach", env=_env(home), cwd=tmp_path
    )
    assert detached.returncode == 0, detached.stdout + detached.stderr
    [run_dir] = (home / "runs").iterdir()
    _wait_for(run_dir / "store" / "status" / "chief-0.json")
    first = _watch(home, tmp_path, run_dir.name)
    assert first.stdout is not None
    seen = first.stdout.readline()  # its first progress line: the watch loop is running, not starting
    assert "nodes up" in seen, seen + first.communicate(timeout=300)[1]
    # the watch owns the run now (it heals and tears down), and `runs` names it
    assert (
        _owner(home, tmp_path, run_dir.name)
        == f"cli {getpass.getuser()}@{socket.gethostname()} pid {first.pid}"
    )
    first.send_signal(signal.SIGINT)  # Ctrl-C on a watcher: the run goes on
    # generous: a limit on a hang, not a speed goal (seen over 60 s on a loaded 2-core machine)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    assert "detached" in out and not (run_dir / "store" / "STOPPED").exists()
    assert alive_node_pids(run_dir.name), "the run goes on without its watcher"
    assert _owner(home, tmp_path, run_dir.name) is None  # given up: the next watch takes it
    second = _watch(home, tmp_path, run_dir.name)
    try:
        out, err = second.communicate(timeout=600)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == 0, out + err
    progress = [line for line in out.splitlines() if "nodes up" in line]
    assert any("step " in line and "/4000" in line for line in progress), out
    assert f"run {run_dir.name}: DONE" in out
    assert alive_node_pids(run_dir.name) == []
