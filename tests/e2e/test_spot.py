"""Spot notices on a real local cluster. EC2's notice cannot exist here: a metadata service on
loopback (tests/metadata_stand_in.py) stands in for each node's instance, answering on its own path,
and the local launcher stands in for the replacement instance."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import Live, start_deploy
from metadata_stand_in import MetadataStandIn
from support import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.slow]

STEPS = 1500
NOTICE_TO_CHECKPOINT = 10.0


def _pointer(live: Live) -> dict[str, Any] | None:
    try:
        return json.loads((live.store / "checkpoints" / "latest.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _checkpoint_after(live: Live, noticed_at: float, timeout: float = 60) -> dict[str, Any]:
    """The store's checkpoint pointer, once it names a checkpoint written after the notice."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pointer = _pointer(live)
        if pointer is not None and (pointer.get("time") or 0) >= noticed_at:
            return pointer
        assert live.proc.poll() is None, live.proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint after the notice in {timeout:.0f}s")


def test_notice_from_the_loopback_metadata_stand_in_checkpoints_at_once_and_the_worker_is_replaced(
    tmp_path: Path,
) -> None:
    with MetadataStandIn() as imds:
        live = start_deploy(
            tmp_path,
            "--workers", "2", "--steps", str(STEPS),
            # no scheduled checkpoint before the end: the one after the notice is the notice's
            "--set", f"training.checkpoint_every={STEPS}",
            "--set", "cluster.workers.spot=true",
            # auto sizes the remote calls, so the call re-run after the node leaves is the largest
            "--set", "training.steps_per_execution=auto",
            # the stand-in listens on this machine's loopback, outside a private namespace
            "--set", "cluster.local_network=host",
            env={"DLINFRA_METADATA_ENDPOINT": imds.node_template()},
        )  # fmt: skip
        live.wait_for_step("chief-0", 300)
        live.published_status("chief-0", lambda s: s["step"] >= 300)  # what the notice records
        imds.recommend_rebalance("worker-1")  # logged and shown only: nothing acts on it
        noticed_at = imds.interrupt("worker-0")
        pointer = _checkpoint_after(live, noticed_at)
        done = live.finish()
        env = {**os.environ, "DLINFRA_HOME": str(live.home)}
        status = run_cli("status", live.run_dir.name, "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert pointer["time"] - noticed_at <= NOTICE_TO_CHECKPOINT, pointer
    assert pointer["step"] < STEPS, "the notice's checkpoint, not the final one"

    [notice] = [
        json.loads(p.read_text()) for p in (live.store / "notices").glob("worker-0.*.json")
    ]  # the only interruption, of the only node that was told
    assert notice["kind"] == "interruption" and notice["action"] == "terminate" and notice["acted"]
    assert notice["step_at_notice"] is not None and pointer["step"] >= notice["step_at_notice"], (
        "the checkpoint holds every step trained before the notice"
    )
    assert notice["exit_code"] == 76 and notice["steps_lost"] == 0
    assert notice["left"] - notice["noticed"] < 60
    launcher = live.log("worker-0").read_text()
    assert "launcher: worker-0 exited with code 76: starting its replacement" in launcher
    assert {node for node, _ in imds.answered} == {"worker-0", "worker-1"}
    assert {path.rsplit("/", 1)[1] for node, path in imds.answered if node == "worker-0"} == {
        "instance-action"
    }

    metrics = live.metrics
    # worker-0 may leave during a remote call, which TensorFlow then re-runs on worker-1; a call
    # counts once it has run all its steps, so only a call that finished just as the node left and
    # could not report is counted twice: at most one call (a call is at most log_every, 20, steps)
    assert STEPS <= metrics["steps"] <= STEPS + 20, metrics["steps"]
    by_size = {int(size): steps for size, steps in metrics["steps_per_call"].items()}
    most = max(by_size, key=by_size.__getitem__)
    assert 1 in by_size and most >= 2 and max(by_size) <= 20, f"auto started at 1 and grew: {by_size}"
    assert [n["node"] for n in metrics["interruptions"]] == ["worker-0"]
    assert metrics["interruptions"][0]["steps_lost"] == 0 and metrics["rebalances"] == 1
    assert "resuming from checkpoint" not in live.log("chief-0").read_text(), "nothing to resume: 0 lost"

    nodes = json.loads(status.stdout)["nodes"]
    assert nodes["worker-0"]["restarts"] == 0, "a replacement, not a restart"
    assert nodes["worker-1"]["notice"] == "rebalance recommended"
    assert nodes["worker-1"]["restarts"] == 0 and nodes["chief-0"]["notice"] is None
    rebalance = [json.loads(p.read_text()) for p in (live.store / "notices").glob("worker-1.*.json")]
    assert [(n["kind"], n["acted"]) for n in rebalance] == [("rebalance", False)]
    print(
        "\nFAULT spot notice for worker-0: "
        + json.dumps(
            {
                "notice_to_checkpoint_seconds": round(pointer["time"] - noticed_at, 1),
                "notice_seconds_used": round(notice["left"] - notice["noticed"], 1),
                "steps_lost": notice["steps_lost"],
            }
        )
    )
