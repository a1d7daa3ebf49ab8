"""The restart contract shared by systemd on EC2 and the local launcher, on real processes and real
TensorFlow errors (no cluster needed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dlinfra.contract import (
    EXIT_DONE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_RETRY,
    FINAL_EXIT_CODES,
    NO_RESTART_EXIT_CODES,
)
from dlinfra.node.supervision import backoff_seconds, is_replaced, is_transient, should_restart
from dlinfra.render import Install, render_cluster
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import NodeState
from dlinfra.runs.store_url import open_store
from dlinfra.spec.model import Spec
from support import fixed_locks, node_configs


def test_signals_and_retry_restart_final_codes_do_not() -> None:
    assert should_restart(-9) and should_restart(EXIT_RETRY) and should_restart(137) and should_restart(-11)
    assert not should_restart(-15) and not should_restart(-2), "told to stop, as systemd sees it"
    assert not any(should_restart(code) for code in FINAL_EXIT_CODES)
    assert not should_restart(None)


def test_an_interrupted_node_is_replaced_not_restarted_in_place() -> None:
    assert not should_restart(EXIT_INTERRUPTED) and is_replaced(EXIT_INTERRUPTED)
    assert EXIT_INTERRUPTED not in FINAL_EXIT_CODES, "it ends the machine's part, not the run"
    assert not any(is_replaced(code) for code in (*FINAL_EXIT_CODES, EXIT_RETRY, -9, None))


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_seconds(n) for n in range(7)] == [0, 1, 2, 4, 8, 16, 30]


def test_lost_peers_are_transient_and_user_errors_are_not() -> None:
    import tensorflow as tf

    assert is_transient(tf.errors.UnavailableError(None, None, "ps-0 unreachable"))
    assert is_transient(tf.errors.AbortedError(None, None, "collective aborted"))
    wrapped = RuntimeError("closure failed")
    wrapped.__cause__ = tf.errors.UnavailableError(None, None, "worker gone")
    assert is_transient(wrapped)
    assert not is_transient(tf.errors.InvalidArgumentError(None, None, "bad shape"))
    assert not is_transient(ValueError("user bug"))


def test_systemd_unit_restarts_exactly_what_the_launcher_restarts() -> None:
    spec = Spec.model_validate({"target": "aws"})
    configs = node_configs(spec, "r-1", "s3://bucket/runs/r-1", "aws")
    locks = {
        flavor: (f"s3://bucket/runs/r-1/code/{lock.file_name}", lock.sha256)
        for flavor, lock in fixed_locks().items()
    }
    text = render_cluster(configs, Install("dlinfra==0", locks=locks))["worker-0"]
    doc = yaml.safe_load(text)
    unit = next(f for f in doc["write_files"] if f["path"].endswith("dlinfra-node.service"))["content"]
    prevented = re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.M)
    assert prevented is not None
    assert {int(c) for c in prevented[1].split()} == set(NO_RESTART_EXIT_CODES) - {0}
    assert "Restart=on-failure" in unit
    poweroff = re.search(r'case "\$EXIT_STATUS" in ([\d|]+)\)', unit)
    assert poweroff is not None and {int(c) for c in poweroff[1].split("|")} == set(NO_RESTART_EXIT_CODES)


def _node(tmp_path: Path, max_restarts: int, status: dict | None = None, marker: str | None = None) -> Path:
    spec = Spec.model_validate({"cluster": {"max_restarts": max_restarts}})
    store = tmp_path / "store"
    configs = node_configs(spec, "r-1", store.as_uri(), "local")
    config = tmp_path / "chief-0.json"
    config.write_text(configs["chief-0"].model_dump_json())
    run_store = RunStore(open_store(store.as_uri()))
    if status is not None:  # what an earlier life of the node left
        earlier = {"node": "chief-0", "role": "chief", "index": 0, "state": "training", "started": 1.0}
        run_store.put_status(NodeState(**(earlier | {"heartbeat": 2.0} | status)))
    if marker is not None:
        run_store.write_marker(marker)
    return config


def _run_node(config: Path) -> subprocess.CompletedProcess[str]:
    # a scratch of its own: the default (<tmp>/dlinfra/<run id>/<node>) is every test's of run r-1,
    # and one test's node left its state there for the next test's node to read as its earlier life
    work = config.parent / "work"
    return subprocess.run(
        [sys.executable, "-m", "dlinfra", "node", "run", str(config), "--work-dir", str(work)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=config.parent,
    )


def test_node_gives_up_after_max_restarts_and_fails_the_run(tmp_path: Path) -> None:
    config = _node(tmp_path, max_restarts=2, status={"restarts": 2, "first_started": 1.0, "step": 40})
    result = _run_node(config)
    assert result.returncode == EXIT_FAILED, result.stdout + result.stderr
    store = tmp_path / "store"
    failed = json.loads((store / "FAILED").read_text())
    assert failed["node"] == "chief-0" and "restarted 3 times (max_restarts)" in failed["error"]
    status = json.loads((store / "status" / "chief-0.json").read_text())
    assert status["restarts"] == 3 and status["state"] == "failed" and status["step"] == 40


def test_node_restarted_after_the_run_ended_exits_cleanly(tmp_path: Path) -> None:
    config = _node(tmp_path, max_restarts=5, status={"restarts": 0, "first_started": 1.0}, marker="DONE")
    result = _run_node(config)
    assert result.returncode == EXIT_DONE, result.stdout + result.stderr
    status = json.loads((tmp_path / "store" / "status" / "chief-0.json").read_text())
    assert status["state"] == "done" and status["restarts"] == 1
    assert not (tmp_path / "store" / "FAILED").exists()


@pytest.mark.parametrize("resumed_at", [0, 3, 40])
def test_skipping_trained_batches_restores_the_data_position(resumed_at: int) -> None:
    """A seeded stream resumed at step k yields exactly what the uninterrupted stream yields from k."""
    import numpy as np
    import tensorflow as tf

    from dlinfra.training.loop import batched

    ds = tf.data.Dataset.from_tensor_slices(np.arange(1000, dtype=np.int64))
    whole = [b.numpy() for b in batched(ds, 32, shuffle_seed=7).take(resumed_at + 5)]
    resumed = [b.numpy() for b in batched(ds, 32, shuffle_seed=7, skip_batches=resumed_at).take(5)]
    assert all(np.array_equal(a, b) for a, b in zip(whole[resumed_at:], resumed, strict=True))


def test_the_launcher_leaves_a_node_whose_instance_a_heal_replaces_to_the_heal(tmp_path: Path) -> None:
    """During a heal the emulated instances' supervisors go on (targets.aws.healing, bench_chaos seed
    714), polling with the healed nodes skipped: a node whose instance is being replaced is not
    restarted in place, nor with its mirrored cluster. Real processes: worker-0 (its instance gone)
    was killed, worker-1 exited asking for a retry, worker-2 runs."""
    from dlinfra.targets.local import LocalCluster, NodeProcess

    cluster = LocalCluster(run_dir=tmp_path, restart_together=True)
    relaunched: list[str] = []
    cluster._launch = relaunched.append  # type: ignore[method-assign]  # what it would boot, not a boot

    def node(code: str) -> subprocess.Popen[bytes]:  # a process group of its own, as launch() makes
        return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)

    procs = {
        "worker-0": node("import os, signal; os.kill(os.getpid(), 9)"),
        "worker-1": node(f"raise SystemExit({EXIT_RETRY})"),
        "worker-2": node("import time; time.sleep(60)"),
    }
    try:
        for name, proc in procs.items():
            cluster.nodes[name] = NodeProcess(name, proc, tmp_path / f"{name}.log")
        procs["worker-0"].wait()
        procs["worker-1"].wait()
        codes = cluster.poll(skip=["worker-0"])
        assert sorted(relaunched) == ["worker-1", "worker-2"], relaunched
        assert codes == {"worker-0": -9, "worker-1": None, "worker-2": None}
        assert procs["worker-2"].poll() is not None, "restarted with its cluster: the old life ended"
        relaunched.clear()
        cluster.poll()
        assert "worker-0" in relaunched, "without the heal, a killed node is restarted in place"
    finally:
        procs["worker-2"].kill()
