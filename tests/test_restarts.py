"""A node's restarts: the record each new life writes from the store's word on the last, how it is
said, and which node a failure is blamed on (issue 56: a kill -9 of worker-1 blamed on worker-0)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dlinfra.contract import EXIT_FAILED, NodeConfig, StoreConfig
from dlinfra.node.status import NodeStatus, give_up
from dlinfra.runs import restarts
from dlinfra.runs.diagnosis import diagnose
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import NodeState, Restart
from dlinfra.spec.training import TrainingSpec


def _mirrored(results: Path, index: int) -> NodeConfig:
    return NodeConfig(
        run_id="r",
        role="worker",
        index=index,
        strategy="multi_worker_mirrored",
        cluster={"worker": ["h:1", "h:2"]},
        store=StoreConfig(url=f"file://{results}"),
        training=TrainingSpec(),
        startup_timeout=60,
        heartbeat_interval=1,
        max_runtime=60,
    )


def _life(store: RunStore, cfg: NodeConfig, work: Path) -> NodeStatus:
    work.mkdir(parents=True, exist_ok=True)
    return NodeStatus(store, cfg.name, cfg.role, cfg.index, work)


def _killed(status: NodeStatus, at: float) -> None:
    """How a script-mode agent ends a life whose script was killed (script_end.ended), at `at`."""
    status.update(state="script killed", error="killed by signal 9")
    status.store.put_status(NodeState(**status.fields, heartbeat=at))


def test_a_new_life_records_its_restart_and_completes_it_when_it_trains_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _mirrored(tmp_path / "store", 1)
    store = RunStore.open(cfg.store)
    first = _life(store, cfg, tmp_path / "w1")
    assert first.restart is None and first.fields["restart_history"] == [], "a first life is no restart"
    first.update(state="running", step=45)
    _killed(first, at=1000.0)

    second = _life(store, cfg, tmp_path / "w1")
    pending = second.restart
    assert pending is not None and pending.cause == "killed by signal 9" and pending.failed_at == 1000.0
    assert pending.life == 2 and pending.resumed_at is None
    second.restored(restored_files=3)
    second.training_again(1006.2, step=31)
    assert second.restart is None, "trained again: nothing pending"
    [done] = second.state().restart_history
    assert done.seconds_lost == pytest.approx(6.2) and done.first_step == 31 and done.restored_files == 3
    said = capsys.readouterr().out
    assert "worker-1 restarted (killed by signal 9) at " in said
    assert said.rstrip().endswith(
        "; resumed from its 3 checkpoint files, first report at step 31; 6.2 s lost"
    )

    # the third life keeps the second's record and adds its own; a lost peer is its cause
    second.stop(state="lost peer", error="UnavailableError: …")
    third = _life(store, cfg, tmp_path / "w1")
    history = third.state().restart_history
    assert [r.cause for r in history] == ["killed by signal 9", "lost peer"] and history[1].life == 3
    assert third.fields["restarts"] == 2


def test_a_restart_that_finds_no_checkpoint_says_so_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _mirrored(tmp_path / "store", 1)
    store = RunStore.open(cfg.store)
    _killed(_life(store, cfg, tmp_path / "w1"), at=time.time())
    second = _life(store, cfg, tmp_path / "w1")
    second.restored(from_scratch="$DLINFRA_CHECKPOINT_DIR")
    assert capsys.readouterr().out == "worker-1 restarted from scratch: nothing in $DLINFRA_CHECKPOINT_DIR\n"
    second.training_again(time.time(), step=1)
    assert "from scratch: nothing in $DLINFRA_CHECKPOINT_DIR;" in capsys.readouterr().out


def test_a_run_that_ended_is_no_restart_of_the_next_life(tmp_path: Path) -> None:
    """A node restarted after the run ended (its marker read at once) did not lose anything."""
    cfg = _mirrored(tmp_path / "store", 1)
    store = RunStore.open(cfg.store)
    _life(store, cfg, tmp_path / "w1").stop(state="done")
    assert _life(store, cfg, tmp_path / "w1").restart is None


def _restart(node: str, failed_at: float, resumed_at: float | None = None, **more: object) -> Restart:
    return Restart(
        node=node,
        life=2,
        cause="killed by signal 9",
        failed_at=failed_at,
        restarted_at=failed_at + 1,
        resumed_at=resumed_at,
        **more,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("record", "says"),
    [
        (_restart("worker-1", 0, 6.2, checkpoint_step=40), "resumed from step 40; 6.2 s lost"),
        (_restart("worker-1", 0, 2.0, first_step=31), "resumed at step 31; 2.0 s lost"),
        (
            _restart("worker-1", 0, 9.5, from_scratch="the store's checkpoints"),
            "from scratch: nothing in the store's checkpoints; 9.5 s lost",
        ),
        (_restart("ps-0", 0, 3.0), "training again; 3.0 s lost"),
        (_restart("worker-1", 0), "not training again before the run ended"),
    ],
)
def test_a_restart_is_said_in_one_line(record: Restart, says: str) -> None:
    line = restarts.line(record)
    assert line.startswith(f"{record.node} restarted (killed by signal 9) at {restarts.clock(0)}; ")
    assert line.endswith(says)


def _state(node: str, *history: Restart, heartbeat: float = 100.0, **fields: object) -> NodeState:
    role, index = node.split("-")
    return NodeState(
        node=node,
        role=role,
        index=int(index),
        state=str(fields.pop("state", "running")),
        started=0,
        first_started=0,
        heartbeat=heartbeat,
        restart_history=list(history),
        **fields,  # type: ignore[arg-type]
    )


def test_news_says_each_restart_once_as_it_happens() -> None:
    news = restarts.News()
    pending = _state("worker-1", _restart("worker-1", 10.0, from_scratch="$DLINFRA_CHECKPOINT_DIR"))
    assert news([pending, None]) == ["worker-1 restarted from scratch: nothing in $DLINFRA_CHECKPOINT_DIR"]
    assert news([pending]) == []
    resumed = _state("worker-1", _restart("worker-1", 10.0, 12.0, from_scratch="$DLINFRA_CHECKPOINT_DIR"))
    [line] = news([resumed])
    assert line.startswith("worker-1 restarted (killed by signal 9)") and line.endswith("; 2.0 s lost")
    assert news([resumed]) == []
    assert restarts.summary(restarts.of_nodes([resumed])) == "1 (worker-1)"
    assert restarts.summary([]) == "none"


def test_the_cause_of_a_restart_is_read_from_the_last_life_as_it_ended() -> None:
    assert restarts.cause_of(_state("worker-0", state="lost peer")) == "lost peer"
    assert restarts.cause_of(_state("worker-1", state="interrupted")) == "spot notice"
    # a Program-mode trainer killed outright: its beacon's last beat says how (beacon.watch)
    assert (
        restarts.cause_of(_state("worker-1", error="killed by signal 9", process="gone"))
        == "killed by signal 9"
    )
    assert restarts.cause_of(_state("worker-1", process="gone")) == "process died"
    assert restarts.cause_of(_state("worker-1", process="running")) == "lost"


def test_a_failure_while_recovering_is_blamed_on_the_node_that_failed_first(tmp_path: Path) -> None:
    """The issue's run: worker-1 killed by kill -9, worker-0 restarted by the lost peer, and worker-0's
    checkpoint pull then failed. Its FAILED marker blamed worker-0; the first to fail was worker-1."""
    store = RunStore.open(_mirrored(tmp_path / "store", 0).store)
    now = time.time()
    killed, lost = _mirrored(tmp_path / "store", 1), _mirrored(tmp_path / "store", 0)
    _killed(_life(store, killed, tmp_path / "w1"), at=now - 3.0)
    _life(store, lost, tmp_path / "w0").stop(state="lost peer", error="UnavailableError")
    _life(store, killed, tmp_path / "w1").stop(state="starting")  # restarted, not training yet
    recovering = _life(store, lost, tmp_path / "w0")

    code = give_up(lost, store, recovering, "FileNotFoundError: ckpt-1.data.pulling", "")
    assert code == EXIT_FAILED
    marker = json.loads((tmp_path / "store" / "FAILED").read_text())
    assert marker["node"] == "worker-1", marker
    assert marker["error"].startswith("FileNotFoundError: ckpt-1.data.pulling (after worker-1 restarted: ")
    assert [(r["node"], r["cause"]) for r in marker["restarts"]] == [
        ("worker-1", "killed by signal 9"),
        ("worker-0", "lost peer"),
    ]


def test_a_failure_of_its_own_is_the_node_s_own() -> None:
    """Restarts long past (or trained past) are not the incident of a failure now."""
    nodes = {
        "worker-0": _state("worker-0"),
        "worker-1": _state("worker-1", _restart("worker-1", 10.0, 15.0)),
        "ps-0": _state("ps-0", _restart("ps-0", 20.0)),  # never said it served again
    }
    assert restarts.blamed("worker-0", nodes, now=20.0 + restarts.INCIDENT_SECONDS + 1) == ("worker-0", "")
    assert restarts.blamed("worker-0", nodes, now=30.0)[0] == "ps-0"


def test_the_crashed_verdict_names_the_first_to_fail_not_the_first_by_name() -> None:
    now = time.time()
    nodes: dict[str, NodeState | None] = {
        "worker-0": _state("worker-0", _restart("worker-0", now - 5.0), heartbeat=now - 1),
        "worker-1": _state("worker-1", _restart("worker-1", now - 8.0), heartbeat=now - 1),
    }
    verdict = diagnose(nodes, {"worker-0": 1, "worker-1": 1}, 60, 600, now=now)
    assert verdict is not None and verdict.nodes == ["worker-1", "worker-0"]
    only_zero = diagnose(nodes, {"worker-0": 1, "worker-1": None}, 60, 600, now=now)
    assert only_zero is not None and only_zero.nodes[0] == "worker-1"
    assert only_zero.detail == "worker-0 exited with code 1 after worker-1 restarted"
    # without restarts: the node that stopped beating first
    plain = {
        "worker-0": _state("worker-0", heartbeat=now - 1),
        "worker-1": _state("worker-1", heartbeat=now - 9),
    }
    crashed = diagnose(plain, {"worker-0": 1, "worker-1": 1}, 60, 600, now=now)  # type: ignore[arg-type]
    assert crashed is not None and crashed.nodes == ["worker-1", "worker-0"]


def test_a_restarted_script_is_training_again_at_its_first_report(tmp_path: Path) -> None:
    """Not when its CPU first moves (TensorFlow's import does that): the report says the step too."""
    from dlinfra.node.script_progress import ScriptProgress

    cfg = _mirrored(tmp_path / "store", 1)
    store = RunStore.open(cfg.store)
    first = _life(store, cfg, tmp_path / "w1")
    first.update(state="running", step=45)
    _killed(first, at=time.time() - 8.0)
    second = _life(store, cfg, tmp_path / "w1")
    progress = ScriptProgress(second, tmp_path / "w1" / "progress.json")
    progress._cpu = (time.time() - 60, 0.0)  # busy for a minute: still no report, so not yet
    progress.busy(os.getpid())
    assert second.restart is not None, "a script that reported before is back when it reports"
    reported = time.time()
    (tmp_path / "w1" / "progress.json").write_text(json.dumps({"step": 31, "time": reported, "scalars": {}}))
    progress.read()
    [record] = second.state().restart_history
    assert record.first_step == 31 and record.resumed_at == pytest.approx(reported)


def test_a_node_its_supervisor_restarted_with_the_cluster_says_so_and_when(tmp_path: Path) -> None:
    """A healthy mirrored worker the local launcher ends so the cluster restarts whole had no last
    word: its last beat, seconds old, would date its fault before the one that caused it."""
    from dlinfra.node.supervision import note_restart_cause

    cfg = _mirrored(tmp_path / "store", 0)
    store = RunStore.open(cfg.store)
    beat = _life(store, cfg, tmp_path / "w0")
    store.put_status(NodeState(**beat.fields, heartbeat=time.time() - 9, process="running"))
    note_restart_cause(tmp_path / "w0", "restarted with the cluster after worker-1")
    ended = time.time()
    record = _life(store, cfg, tmp_path / "w0").restart
    assert record is not None and record.cause == "restarted with the cluster after worker-1"
    assert record.failed_at == pytest.approx(ended, abs=1.0)
    _life(store, cfg, tmp_path / "w0").stop(state="lost peer")
    assert _life(store, cfg, tmp_path / "w0").restart.cause == "lost peer", "the word is read once"  # type: ignore[union-attr]


def test_a_node_between_two_lives_counts_as_restarting() -> None:
    """The run can end (or a peer fail) before the next life publishes its record: the last life's
    end says enough (a ps worker killed at the end of a short run was missing from metrics.json)."""
    killed = _state("worker-0", state="script killed", error="killed by signal 9", heartbeat=50.0)
    [record] = restarts.of_nodes({"worker-0": killed}.values())
    assert (record.cause, record.failed_at, record.life, record.resumed_at) == (
        "killed by signal 9",
        50.0,
        2,
        None,
    )
    assert (
        restarts.blamed("worker-1", {"worker-0": killed, "worker-1": _state("worker-1")}, now=60.0)[0]
        == "worker-0"
    )
    assert restarts.of_nodes([_state("worker-0", state="done", process="gone")]) == []


def test_a_life_that_restored_the_final_checkpoint_keeps_the_step_its_script_reached(tmp_path: Path) -> None:
    """A kill after the last step: the new life restores the final checkpoint, has nothing left to
    train and reports nothing; the run's step count is still the one the script reached."""
    from dlinfra.node.script_progress import ScriptProgress

    cfg = _mirrored(tmp_path / "store", 0)
    store = RunStore.open(cfg.store)
    first = _life(store, cfg, tmp_path / "w0")
    first.update(state="running", step=120)
    _killed(first, at=1000.0)
    second = ScriptProgress(_life(store, cfg, tmp_path / "w0"), tmp_path / "w0" / "progress.json")
    second.read()  # no report in this life
    assert second.step is None and second.last_step == 120
    (tmp_path / "w0" / "progress.json").write_text(json.dumps({"step": 121, "time": 1001.0}))
    second.read()
    assert second.last_step == 121
    fresh = ScriptProgress(_life(store, _mirrored(tmp_path / "store", 1), tmp_path / "w1"), tmp_path / "p")
    assert fresh.last_step is None, "a first life that reported nothing reached no known step"


def test_a_finished_mirrored_worker_stays_until_the_run_ends_and_rejoins_when_a_peer_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_restarts seed 59, kill 18: the owner killed after worker-1 exited 0; the owner's new life
    waited for a peer that had left, until stall_timeout. A finished worker now stays a member: it
    rejoins (EXIT_RETRY, its next life a restart with the owner's name as cause) when a peer begins a
    new life, and leaves with EXIT_DONE once the run's marker is written."""
    from dlinfra.contract import EXIT_DONE, EXIT_RETRY
    from dlinfra.node import membership

    monkeypatch.setattr(membership, "LOOK_SECONDS", 0.1)
    owner_cfg, cfg = _mirrored(tmp_path / "store", 0), _mirrored(tmp_path / "store", 1)
    store = RunStore.open(cfg.store)
    owner = _life(store, owner_cfg, tmp_path / "w0")
    owner.stop(state="exporting")  # the owner saves the model; worker-1's training has ended well
    worker = _life(store, cfg, tmp_path / "w1")
    owner_restarts = threading.Thread(
        target=lambda: _once_done(store, cfg.name, lambda: _killed(owner, at=time.time())), daemon=True
    )
    owner_restarts.start()
    assert membership.stay_until_the_run_ends(cfg, store, worker, step=180) == EXIT_RETRY
    owner_restarts.join()
    again = _life(store, cfg, tmp_path / "w1")
    assert again.restart is not None and again.restart.cause == "restarted with the cluster after worker-0"
    assert again.fields["restarts"] == 1 and again.fields["step"] == 180

    # a peer's new life, published after this one began to stay, is one to rejoin too
    owner_back = _life(store, owner_cfg, tmp_path / "w0")
    owner_back.stop(state="exporting")
    late = threading.Thread(
        target=lambda: _once_done(store, cfg.name, lambda: _life(store, owner_cfg, tmp_path / "w0").stop()),
        daemon=True,
    )
    late.start()
    assert membership.stay_until_the_run_ends(cfg, store, again, step=180) == EXIT_RETRY
    late.join()

    # the run ends: a staying member leaves done, and so does the owner at once
    third = _life(store, cfg, tmp_path / "w1")
    store.write_marker("DONE", node=owner_cfg.name)
    assert membership.stay_until_the_run_ends(cfg, store, third, step=180) == EXIT_DONE
    assert store.status(cfg.name).state == "done"  # type: ignore[union-attr]
    assert membership.stay_until_the_run_ends(owner_cfg, store, owner_back, step=180) == EXIT_DONE


def _once_done(store: RunStore, node: str, then: Callable[[], object]) -> None:
    """`then`, once `node` has published its end: after it began to stay."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and getattr(store.status(node), "state", None) != "done":
        time.sleep(0.05)
    time.sleep(0.01)  # a life that begins after the stay began starts at a later clock reading
    then()


def test_a_staying_member_of_a_large_cluster_reads_a_few_peers_a_look_and_still_sees_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every member stays while the owner saves: reading all N peers each look would cost the cluster
    N² reads every 2 s. A look reads the owner and a few others in turn; a new life of the last of 40
    workers is still seen, within the looks one round takes."""
    from dlinfra.contract import EXIT_RETRY
    from dlinfra.node import membership

    monkeypatch.setattr(membership, "LOOK_SECONDS", 0.01)
    workers = [f"h:{i}" for i in range(40)]
    cfg = _mirrored(tmp_path / "store", 1).model_copy(update={"cluster": {"worker": workers}})
    last = _mirrored(tmp_path / "store", 39).model_copy(update={"cluster": {"worker": workers}})
    store = RunStore.open(cfg.store)
    reads: list[list[str]] = []
    real_statuses = store.statuses

    def statuses(names: list[str]) -> dict[str, NodeState | None]:
        reads.append(names)
        if len(reads) == 2:  # after this node began to stay: the last worker begins a new life
            _life(store, last, tmp_path / "w39").stop()
        return real_statuses(names)

    monkeypatch.setattr(store, "statuses", statuses)
    assert (
        membership.stay_until_the_run_ends(cfg, store, _life(store, cfg, tmp_path / "w1"), step=9)
        == EXIT_RETRY
    )
    assert all(len(names) <= membership.PEERS_PER_LOOK and names[0] == "worker-0" for names in reads)
    rounds = -(-38 // (membership.PEERS_PER_LOOK - 1))  # the 38 others, a few a look
    assert 2 < len(reads) <= 2 + rounds, reads
    seen = {name for names in reads[:rounds] for name in names}
    assert seen == {f"worker-{i}" for i in range(40)} - {"worker-1"}, "one round reads every peer"
