"""The trainer as a fork of its beacon, not a new interpreter: the beacon has already imported what
the trainer imports before TensorFlow (dlinfra's node modules, pydantic: 0.25 s of CPU each time).
Five nodes starting on two cores spent that ten times over while the chief loaded TensorFlow, and
the trainer's own copy stood between the chief's spawn and its TensorFlow import.

The fork is taken before the beacon starts any thread, in its own process group, dying with the beacon
(reaper.die_with_parent), with stdin closed: what `subprocess.Popen` gave the `dlinfra node train`
it used to run. `TrainerProcess` is the part of Popen's interface the beacon uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from dlinfra.node import reaper

WAIT_STEP = 0.05  # a bounded wait looks this often, as Popen.wait(timeout) does at most


class TrainerProcess:
    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (negative: the signal that ended it); subprocess.TimeoutExpired after
        `timeout` seconds, as Popen.wait."""
        if timeout is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        end = time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = end - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"trainer {self.pid}", timeout)
            time.sleep(min(WAIT_STEP, left))
        return code


def start(config_path: Path, work: Path, log_file: Path | None, environ: dict[str, str]) -> TrainerProcess:
    """Fork; the child, with `environ` added, runs the node's agent and exits with its code, never
    returning into the beacon."""
    if threading.active_count() > 1:  # a fork copies one thread: any lock another held stays held
        raise RuntimeError("the trainer is forked before the beacon starts a thread")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return TrainerProcess(pid)
    code = 1
    try:
        os.setpgid(0, 0)  # its own group: a signal meant for it leaves the beacon to report (not a
        # session of its own: see local_launch on the scheduler's autogroups)
        reaper.die_with_parent()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.environ.update(environ)
        from dlinfra.node.agent import run

        code = run(config_path, log_file, work)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)  # as Python exits
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # TF server threads never join; and never back into the beacon's code
