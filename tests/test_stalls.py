"""Stalls named sooner and right (issue 56, part 6), without a cluster: the bound a script's own
report pace sets, the node a stalled run's headline names (from real py-spy dumps of a 2-worker
MultiWorkerMirroredStrategy run whose worker 1 hung in time.sleep), and what a script without
reports shows instead of `starting`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from dlinfra.cli.views import nodes_table, progress_line
from dlinfra.contract import StoreConfig
from dlinfra.node import script_progress
from dlinfra.node.script_progress import STALL_FLOOR, ScriptProgress, stall_after
from dlinfra.node.status import NodeStatus
from dlinfra.runs.diagnosis import diagnose, hung_first, where_it_waits
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import NodeState
from dlinfra.watching import Snapshot

STACKS = Path(__file__).parent / "data" / "stacks"
# Real dumps, as the beacons stored them: worker 1 hung in the script's own sleep, worker 0 waited for
# it in the next step's all-reduce (tests/data/scripts/mwms_hang.py)
HUNG = (STACKS / "mwms_worker_hung_in_time_sleep.txt").read_text()
WAITING = (STACKS / "mwms_worker_waiting_in_all_reduce.txt").read_text()
NOW = 10_000.0


def node(name: str, **fields: object) -> NodeState:
    role, _, index = name.rpartition("-")
    base = {"node": name, "role": role, "index": int(index), "state": "running", "started": 1.0}
    return NodeState(**(base | {"first_started": 1.0, "heartbeat": NOW - 1} | fields))


def test_the_bound_is_a_multiple_of_the_median_interval_with_a_floor() -> None:
    assert stall_after([2.0, 2.1, 1.9, 30.0]) == STALL_FLOOR  # 10 x 2.05 s is under the floor
    assert stall_after([6.0, 6.0, 300.0]) == 60.0  # one long gap does not move the median
    assert stall_after([6.0, 6.0, 6.0], longest_pause=50.0) == 100.0  # a pause it came back from


@pytest.mark.parametrize(
    ("case", "paced", "stall_timeout", "silent_for", "stalled"),
    [
        ("reports every 2 s: stalled after the floor", [30.0, 30.0], 600.0, 31.0, True),
        ("not yet", [30.0, 30.0], 600.0, 29.0, False),
        ("the most patient node governs", [30.0, 120.0], 600.0, 100.0, False),
        ("stall_timeout stays the ceiling", [900.0, None], 60.0, 61.0, True),
        ("without reports: stall_timeout", [None, None], 600.0, 599.0, False),
    ],
)
def test_a_reporting_script_is_stalled_after_its_own_pace_not_stall_timeout(
    case: str, paced: list[float | None], stall_timeout: float, silent_for: float, stalled: bool
) -> None:
    nodes: dict[str, NodeState | None] = {
        f"worker-{i}": node(f"worker-{i}", step=8, progress_at=NOW - silent_for, stall_after=bound)
        for i, bound in enumerate(paced)
    }
    verdict = diagnose(nodes, {}, 30.0, stall_timeout, now=NOW)
    assert (verdict is not None and verdict.kind == "stalled") == stalled, case
    if verdict is not None:
        assert "while every node is alive" in verdict.detail


@pytest.mark.parametrize(
    ("case", "working_for", "stall_timeout", "stalled"),
    [
        ("at work on CPU 5 s ago (an evaluation): paused, not hung", 5.0, 600.0, False),
        ("idle since its last report: hung", None, 600.0, True),
        ("idle for longer than the pace allows since it last worked", 35.0, 600.0, True),
        ("at work, but past stall_timeout: the ceiling holds", 5.0, 60.0, True),
    ],
)
def test_the_pace_bound_waits_for_a_script_at_work_between_reports(
    case: str, working_for: float | None, stall_timeout: float, stalled: bool
) -> None:
    working_at = None if working_for is None else NOW - working_for
    nodes: dict[str, NodeState | None] = {
        "worker-0": node("worker-0", step=8, progress_at=NOW - 90, stall_after=30.0, working_at=working_at),
        "worker-1": node("worker-1", step=8, progress_at=NOW - 90, stall_after=30.0),
    }
    verdict = diagnose(nodes, {}, 30.0, stall_timeout, now=NOW)
    assert (verdict is not None and verdict.kind == "stalled") == stalled, case


def test_a_reporting_script_that_works_on_cpu_between_reports_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real busy process that has reported: its node publishes when it was last seen at work."""
    progress = _progress(tmp_path)
    (tmp_path / "progress.json").write_text(json.dumps({"step": 3, "time": time.time()}))
    progress.read()
    _watch_a_spinning_process(progress, "working_at", monkeypatch)
    assert progress.status.fields.get("working_at") is not None
    assert progress.status.fields.get("cpu_percent") is None, "a reporting script shows its step, not CPU"


def test_the_stall_names_the_node_that_hung_not_the_one_waiting_for_it_in_a_collective() -> None:
    dumps = {"worker-0": WAITING, "worker-1": HUNG}
    assert where_it_waits(HUNG) == "waits in wait_for_something_that_never_comes (train.py:44)"
    assert where_it_waits(WAITING).startswith("waits in quick_execute (tensorflow/python/eager/")
    assert hung_first(["worker-0", "worker-1"], dumps) == ["worker-1", "worker-0"]
    assert hung_first(["worker-1", "worker-0"], dumps)[0] == "worker-1"
    # a node whose dump never came names nobody: the one seen hanging still goes first
    assert hung_first(["worker-0", "worker-1"], {"worker-1": HUNG}) == ["worker-1", "worker-0"]
    # every node waiting in TensorFlow: the order stays
    assert hung_first(["worker-0", "worker-1"], {"worker-0": WAITING, "worker-1": WAITING}) == [
        "worker-0",
        "worker-1",
    ]


def test_a_project_directory_named_after_tensorflow_is_still_user_code() -> None:
    mine = HUNG.replace("(train.py:44)", "(/home/me/tensorflow-experiments/train.py:44)")
    assert hung_first(["worker-0", "worker-1"], {"worker-0": WAITING, "worker-1": mine})[0] == "worker-1"


def _progress(tmp_path: Path) -> ScriptProgress:
    store = RunStore.open(StoreConfig(url=(tmp_path / "store").as_uri()))
    return ScriptProgress(NodeStatus(store, "worker-0", "worker", 0, tmp_path), tmp_path / "progress.json")


def _watch_a_spinning_process(progress: ScriptProgress, field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Look at a real process spinning on a core, as the agent looks at its script, until `field` is
    published (20 s at most: a loaded machine may give it little of a core)."""
    # windows of half a second, busy from a tenth of a core: a loaded machine still gives that
    monkeypatch.setattr(script_progress, "BUSY_WINDOW", 0.5)
    monkeypatch.setattr(script_progress, "BUSY_CPU_SECONDS", 0.05)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 20
        while progress.status.fields.get(field) is None and time.monotonic() < deadline:
            progress.busy(spinner.pid)
            time.sleep(0.6)
    finally:
        spinner.kill()
        spinner.wait()


def test_a_script_reporting_every_2s_publishes_the_floor_as_its_stall_bound(tmp_path: Path) -> None:
    progress = _progress(tmp_path)
    for step in range(1, 6):
        (tmp_path / "progress.json").write_text(json.dumps({"step": step, "time": 100.0 + 2 * step}))
        progress.read()
        progress.read()  # the same report read again paces nothing
        if step < 4:  # three intervals before its pace counts
            assert progress.status.fields.get("stall_after") is None
    assert progress.status.fields["stall_after"] == STALL_FLOOR


def test_a_script_that_reports_nothing_shows_that_it_runs_and_its_cpu_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress = _progress(tmp_path)
    progress.status.update(state="running")
    _watch_a_spinning_process(progress, "cpu_percent", monkeypatch)
    cpu = progress.status.fields["cpu_percent"]
    assert 5 <= cpu <= 150, cpu  # one spinning thread: up to a core, give or take a clock tick
    state = NodeState(**progress.status.fields, heartbeat=time.time())
    line = progress_line(Snapshot({"worker-0": state, "worker-1": None}, None, 12.0))
    assert f"nodes up 1/2 · running · no progress reported · CPU {cpu:.0f}%" in line
    assert "starting" not in line
    table = nodes_table({"worker-0": state.model_dump()}, 200)
    assert f"running · no progress reported · CPU {cpu:.0f}%" in _text(table)


def _text(table: Table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()
