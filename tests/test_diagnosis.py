"""Verdicts on a running cluster, table by table; and what a beacon sees of a real process from
outside (its /proc state when stopped, its stacks through py-spy)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dlinfra.contract import StoreConfig
from dlinfra.node.beacon import dump_stacks, process_state
from dlinfra.node.status import NodeStatus
from dlinfra.runs.diagnosis import Verdict, diagnose, stack_summary, where_it_waits
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import NodeState

NOW = 10_000.0
BEAT, STALL = 8.0, 60.0


def node(name: str, **fields: object) -> NodeState:
    role, _, index = name.rpartition("-")
    base = {"node": name, "role": role, "index": int(index), "state": "training", "started": 1.0}
    return NodeState(**(base | {"first_started": 1.0, "heartbeat": NOW - 1} | fields))


HEALTHY = {
    "chief-0": node("chief-0", progress_at=NOW - 2, total_steps=100),
    "worker-0": node("worker-0", state="serving"),
    "ps-0": node("ps-0", state="serving"),
}

CASES = [
    ("all well", HEALTHY, {}, None),
    ("not yet booted", {**HEALTHY, "worker-0": None}, {}, None),
    ("crashed beats everything", {**HEALTHY}, {"ps-0": 1, "chief-0": None}, ("crashed", ["ps-0"])),
    ("a clean exit is no crash", HEALTHY, {"chief-0": 0}, None),
    (
        "stopped past the timeout",
        {**HEALTHY, "worker-0": node("worker-0", process="stopped", stopped_since=NOW - 9)},
        {},
        ("frozen", ["worker-0"]),
    ),
    (
        "stopped, not yet for long",
        {**HEALTHY, "worker-0": node("worker-0", process="stopped", stopped_since=NOW - 3)},
        {},
        None,
    ),
    (
        # the frozen worker's peers wait on it and may look idle: the stopped one is the culprit
        "frozen beats a silent chief",
        {
            **HEALTHY,
            "chief-0": node("chief-0", heartbeat=NOW - 30, progress_at=NOW - 30),
            "worker-0": node("worker-0", process="stopped", stopped_since=NOW - 20),
        },
        {},
        ("frozen", ["worker-0"]),
    ),
    (
        "silent beacons are lost, longest first",
        {
            **HEALTHY,
            "ps-0": node("ps-0", heartbeat=NOW - 20),
            "worker-0": node("worker-0", heartbeat=NOW - 40),
        },
        {},
        ("lost", ["worker-0", "ps-0"]),
    ),
    (
        "a finished node may be silent",
        {**HEALTHY, "ps-0": node("ps-0", state="done", heartbeat=0.0)},
        {},
        None,
    ),
    (
        "a replacement instance gets time to boot",
        {**HEALTHY, "worker-0": node("worker-0", state="replacing", heartbeat=NOW - 300)},
        {},
        None,
    ),
    (
        "no step for stall_timeout, all alive",
        {**HEALTHY, "chief-0": node("chief-0", progress_at=NOW - 61)},
        {},
        ("stalled", ["chief-0", "ps-0", "worker-0"]),
    ),
    (
        "exporting is not stalling",
        {**HEALTHY, "chief-0": node("chief-0", state="exporting", progress_at=0.0)},
        {},
        None,
    ),
    ("no step yet: the startup timeout governs", {**HEALTHY, "chief-0": node("chief-0")}, {}, None),
]


@pytest.mark.parametrize(("nodes", "codes", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_diagnose(nodes, codes, expected) -> None:
    verdict = diagnose(nodes, codes, BEAT, STALL, now=NOW)
    assert (None if verdict is None else (verdict.kind, verdict.nodes)) == expected


def test_silence_while_the_store_was_out_is_not_loss_and_silence_after_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by bench_chaos (seed 105): a store outage of 14 s failed a run as `lost` under a 20 s
    heartbeat_timeout, the nodes' beats held back by the outage. A real moto server, stopped and
    started on its port; the watcher's read outlasts the outage and dates its return."""
    import threading

    from dlinfra.runs.s3_store import S3Store
    from stoppable_moto import StoppableMoto
    from support import FAKE_CREDS, s3_client

    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    moto = StoppableMoto()
    s3_client(moto.endpoint).create_bucket(Bucket="beats")
    store = RunStore(S3Store("s3://beats/run", moto.endpoint, retry_for=60))
    beat = time.time()
    for name in HEALTHY:
        store.put_status(node(name, heartbeat=beat, progress_at=beat))
    assert store.store.reachable_since == 0.0, "it never failed"
    moto.down()
    down_at, down = time.time(), 2.0

    def back() -> None:
        time.sleep(down)
        moto.up()

    threading.Thread(target=back).start()
    try:
        seen = {name: store.status(name) for name in HEALTHY}  # blocks through the outage
        back_at = store.store.reachable_since
        assert back_at >= beat + down
        out_from, out_until = store.store.last_outage or (0.0, 0.0)  # what the node's record takes
        assert out_until == back_at and down_at <= out_from <= down_at + 0.5, (out_from, down_at)
        beat_timeout = down / 2  # shorter than the outage: every node is silent past it
        assert diagnose(seen, {}, beat_timeout, STALL, now=back_at + 0.1, store_back=back_at) is None
        lost = diagnose(seen, {}, beat_timeout, STALL, now=back_at + 0.1)
        assert lost is not None and lost.kind == "lost", "without the store's return it reads as loss"
        later = diagnose(seen, {}, beat_timeout, STALL, now=back_at + beat_timeout + 0.1, store_back=back_at)
        assert later is not None and later.kind == "lost", "silent past the timeout after the store is back"
    finally:
        moto.stop()


def test_a_trainer_stuck_before_its_first_step_is_stalled(tmp_path: Path) -> None:
    """The stall clock starts when training does (a ps cluster on one CPU used to sit at step 0 for
    good): waiting for peers never counts, re-entering training does not reset the clock."""
    store = RunStore.open(StoreConfig(url=(tmp_path / "store").as_uri()))
    status = NodeStatus(store, "chief-0", "chief", 0, tmp_path)
    status.update(state="waiting for peers")
    assert status.fields.get("progress_at") is None
    status.update(state="training")
    began = status.fields["progress_at"]
    assert began is not None
    status.update(state="training", loss=None)
    assert status.fields["progress_at"] == began

    def cluster(now: float) -> dict[str, NodeState | None]:
        chief = NodeState(**status.fields, heartbeat=now - 1)
        return {"chief-0": chief, "ps-0": node("ps-0", state="serving", heartbeat=now - 1)}

    assert diagnose(cluster(began + STALL - 1), {}, BEAT, STALL, now=began + STALL - 1) is None
    verdict = diagnose(cluster(began + STALL + 1), {}, BEAT, STALL, now=began + STALL + 1)
    assert verdict is not None and verdict.kind == "stalled"


DUMP = textwrap.dedent(
    """\
    Process 42: python -m dlinfra node train /x/chief-0.json
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 42 (idle): "MainThread"
        wait (threading.py:327)
        result (concurrent/futures/_base.py:451)
        fetch (tensorflow/python/distribute/coordinator/cluster_coordinator.py:1602)
        train_parameter_server (dlinfra/training/loop.py:211)
    Thread 57 (idle): "dlinfra-watchdog"
        wait (threading.py:331)
    """
)


def test_where_it_waits_skips_waiting_plumbing() -> None:
    assert (
        where_it_waits(DUMP)
        == "waits in fetch (tensorflow/python/distribute/coordinator/cluster_coordinator.py:1602)"
    )
    assert where_it_waits("Process 1\n") == "no Python main thread in the dump"


def test_summary_names_the_stopped_and_the_waiting() -> None:
    nodes = {"chief-0": node("chief-0"), "worker-0": node("worker-0", process="stopped", stopped_since=1.0)}
    summary = stack_summary(Verdict("frozen", ["worker-0"], ""), nodes, {"chief-0": DUMP})
    assert summary == {"chief-0": where_it_waits(DUMP), "worker-0": "is stopped"}


@pytest.fixture
def sleeper(tmp_path: Path):
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import time\n\ndef wait_for_the_peer():\n    print('waiting', flush=True)\n    time.sleep(600)\n\n"
        "wait_for_the_peer()\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    # it has reached the sleep when it said so and the kernel sees it asleep (a fixed second was a
    # guess: Python's start takes longer than that on a loaded machine)
    assert proc.stdout is not None and proc.stdout.readline() == b"waiting\n"
    deadline = time.monotonic() + 30
    while process_state(proc.pid) != "sleeping" and time.monotonic() < deadline:
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def test_beacon_sees_a_stopped_process_and_dumps_its_stacks(sleeper: subprocess.Popen[bytes]) -> None:
    assert process_state(sleeper.pid) == "sleeping"
    sleeper.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while process_state(sleeper.pid) != "stopped" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_state(sleeper.pid) == "stopped"
    dump = dump_stacks(sleeper.pid)  # real py-spy, on a process that cannot be paused
    assert where_it_waits(dump).startswith("waits in wait_for_the_peer (")
    sleeper.kill()
    sleeper.wait()
    assert process_state(sleeper.pid) == "gone"


@pytest.mark.parametrize("trainer_ended", [-signal.SIGKILL, -signal.SIGTERM, -signal.SIGSEGV, 0, 3, 75])
def test_beacon_ends_the_way_its_trainer_ended(trainer_ended: int) -> None:
    """Supervisors judge the beacon's end (restart or not): it must be the trainer's, signals included
    (SIGKILL, whose handler cannot even be reset, was once turned into exit 1 and a failed run)."""
    code = f"import sys\nfrom dlinfra.node.beacon import _end_like\nsys.exit(_end_like({trainer_ended}))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == trainer_ended, done.stderr


BEACON_HARNESS = """
import subprocess, sys
from pathlib import Path
from dlinfra.contract import NodeConfig
from dlinfra.node.beacon import Beacon
from dlinfra.runs.layout import RunStore
cfg = NodeConfig.model_validate_json(Path(sys.argv[1]).read_text())
trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(trainer.pid, flush=True)
Beacon(cfg, RunStore.open(cfg.store), Path(sys.argv[2]), None).watch(trainer)
"""


def test_a_beacon_publishes_news_at_once_and_progress_with_its_beat(tmp_path: Path) -> None:
    """A restarted worker's record of where it resumed reached the store only with its next beat
    (every heartbeat_interval, 10 s by default); the owner wrote the run's end from the store's older
    word in between, and recorded the worker as never training again (a CI run of the custom-loop
    guide). A new state or restart record goes out within a look; a step waits for the beat. The
    beacon runs in a process of its own, watching a real one, as on a node."""
    from dlinfra.spec.training import TrainingSpec
    from support import staging_node

    cfg = staging_node("worker", 0, TrainingSpec(), tmp_path / "results", (tmp_path / "data").as_uri())
    cfg = cfg.model_copy(update={"heartbeat_interval": 3600.0})  # no beat but the first in this test
    (tmp_path / "node.json").write_text(cfg.model_dump_json())
    store, work = RunStore.open(cfg.store), tmp_path / "work"
    work.mkdir()
    status = NodeStatus(store, cfg.name, cfg.role, cfg.index, work)
    status.update(state="waiting for peers", step=3)
    beacon = subprocess.Popen(
        [sys.executable, "-c", BEACON_HARNESS, str(tmp_path / "node.json"), str(work)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        trainer = int(beacon.stdout.readline())  # type: ignore[union-attr]

        def published(**expected: object) -> NodeState:
            deadline = time.monotonic() + 60  # a look is a second; the next beat an hour away
            while time.monotonic() < deadline:
                st = store.status(cfg.name)
                if st is not None and all(getattr(st, k) == v for k, v in expected.items()):
                    return st
                time.sleep(0.2)
            raise AssertionError(f"the store never showed {expected}: {store.status(cfg.name)}")

        first = published(state="waiting for peers", step=3)
        status.update(step=4)  # progress alone is not news
        status.update(state="training")  # news: it carries the step with it
        assert published(state="training").step == 4
        status.update(step=5)
        status.restored(restored_files=3)  # a first life: no restart to complete, no news
        status.update(step=6)
        status.mark("first step")
        assert store.status(cfg.name).step == 4 and store.status(cfg.name).heartbeat > first.heartbeat  # type: ignore[union-attr]
        os.kill(trainer, signal.SIGKILL)
        assert beacon.wait(60) == -signal.SIGKILL, "the beacon ends the way its trainer did"
    finally:
        beacon.kill()
    assert published(process="gone").step == 6, "its end is a beat: it carries everything"


def test_a_life_ended_before_its_first_beat_still_counts_as_a_restart_of_the_next(tmp_path: Path) -> None:
    """Every mirrored worker restarts when one dies. One that had not beaten yet (its beacon beats
    every heartbeat_interval, up to 10 s) was in no record, so its next life said "first life" and
    restarted its clocks (a CI run of the custom-loop guide). The next beacon records it first."""
    from dlinfra.node.beacon import Beacon
    from dlinfra.spec.training import TrainingSpec
    from support import staging_node

    cfg = staging_node("worker", 0, TrainingSpec(), tmp_path / "results", (tmp_path / "data").as_uri())
    store = RunStore.open(cfg.store)
    (tmp_path / "work").mkdir()
    first = NodeStatus(store, cfg.name, cfg.role, cfg.index, tmp_path / "work")
    first.update(state="running", step=45)
    assert store.status(cfg.name) is None, "no beat yet: the store knows nothing of the first life"

    Beacon(cfg, store, tmp_path / "work", None).record_earlier_life(dict(first.fields))
    recorded = store.status(cfg.name)
    assert recorded is not None and recorded.process == "gone" and recorded.step == 45
    second = NodeStatus(store, cfg.name, cfg.role, cfg.index, tmp_path / "work")
    assert second.fields["restarts"] == 1
    assert second.fields["first_started"] == first.fields["started"]

    # a life the store already has (its beacon's last beat, or a healer's word) is left as it is
    store.put_status(NodeState(**second.fields, heartbeat=time.time(), process="running"))
    Beacon(cfg, store, tmp_path / "work", None).record_earlier_life(dict(first.fields))
    assert store.status(cfg.name).process == "running"  # type: ignore[union-attr]
    # and so is the state a node of another run left in a scratch dir of the same name
    stranger = dict(second.fields, started=time.time() + 60, first_started=time.time() + 60, step=7)
    Beacon(cfg, store, tmp_path / "work", None).record_earlier_life(stranger)
    assert store.status(cfg.name).step == second.fields["step"]  # type: ignore[union-attr]
