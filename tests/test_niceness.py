"""A node's startup loads at a lower CPU priority where it has time to spare (node.niceness): a
parameter-server run's serving nodes load their CLI and beacon in a nicer thread, so the chief's
beacon is not one of five equal shares of two cores, and go on at their process's nice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dlinfra.contract import NodeConfig
from dlinfra.node.niceness import START_NICENESS_ENV, in_nicer_thread
from dlinfra.spec.training import TrainingSpec
from dlinfra.targets.local_launch import START_NICENESS, process_environ
from support import staging_node


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_work_runs_nicer_in_a_thread_that_has_ended_by_the_return() -> None:
    before = _nice()
    seen = in_nicer_thread(lambda: (_nice(), threading.get_native_id()), 3, "probe")
    assert seen[0] == before + 3 and seen[1] != threading.get_native_id()
    assert _nice() == before, "the caller's own priority is untouched"
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("probe")]
    with pytest.raises(ZeroDivisionError):
        in_nicer_thread(lambda: 1 / 0, 3, "probe")


PROBE = """
import json, os, runpy, sys, threading

class Loads:  # the nice of the thread that imports each of these modules
    def find_spec(self, name, path, target=None):
        if name in ("dlinfra.cli.app", "dlinfra.node.beacon"):
            nice[name] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return None

nice = {"process": os.getpriority(os.PRIO_PROCESS, 0)}
sys.meta_path.insert(0, Loads())
sys.argv = ["dlinfra", "version"]
try:
    runpy.run_module("dlinfra", run_name="__main__")
finally:
    nice["main after"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    print(json.dumps(nice))
"""


@pytest.mark.parametrize("niceness", [0, 7])
def test_python_m_dlinfra_loads_nicer_when_asked_and_runs_at_its_processs_nice(niceness: int) -> None:
    environ = {name: value for name, value in os.environ.items() if name != START_NICENESS_ENV}
    if niceness:
        environ[START_NICENESS_ENV] = str(niceness)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=environ
    )
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "0.1.0", done.stdout + done.stderr  # the command ran
    nice = json.loads(lines[-1])
    base = nice["process"]
    assert nice["dlinfra.cli.app"] == base + niceness
    if niceness:  # `version` needs no beacon: only a node's start loads it
        assert nice["dlinfra.node.beacon"] == base + niceness
    assert nice["main after"] == base


def test_only_a_parameter_server_runs_serving_nodes_start_nicer(tmp_path: Path) -> None:
    def asked(cfg: NodeConfig) -> str | None:
        return process_environ(cfg, tmp_path / "work", None).get(START_NICENESS_ENV)

    node = staging_node("worker", 0, TrainingSpec(), tmp_path, f"file://{tmp_path}/data")
    assert asked(node) == asked(node.model_copy(update={"role": "ps"})) == str(START_NICENESS)
    assert asked(node.model_copy(update={"role": "chief"})) is None, "the chief's start is the run's"
    mirrored = node.model_copy(update={"strategy": "multi_worker_mirrored"})
    assert asked(mirrored) is None, "every worker of an all-reduce is on the way to the first step"
