"""The trainer is a fork of its beacon (node/trainer_process.py): the beacon reads its end as it read
a Popen's (an exit code, or minus the signal that ended it), and never forks with a thread running."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dlinfra.node import trainer_process
from dlinfra.node.trainer_process import TrainerProcess


def _child(then: str) -> TrainerProcess:
    pid = os.fork()
    if pid == 0:
        if then == "sleep":
            time.sleep(60)
        os._exit(75)
    return TrainerProcess(pid)


def test_its_exit_code_and_its_death_by_a_signal_read_as_popen_reads_them() -> None:
    done = _child("exit")
    assert done.wait() == 75 and done.poll() == 75
    sleeping = _child("sleep")
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.wait(0.05)
    assert sleeping.poll() is None
    os.kill(sleeping.pid, signal.SIGKILL)
    assert sleeping.wait(30) == -signal.SIGKILL


def test_no_fork_while_another_thread_runs(tmp_path: Path) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with pytest.raises(RuntimeError, match="before the beacon starts a thread"):
            trainer_process.start(tmp_path / "node.json", tmp_path, None, {})
    finally:
        stop.set()
        thread.join()
