"""Startup's clock starts with the command's process, not with its function: what the interpreter
and the CLI's imports take is part of the user's wait."""

from __future__ import annotations

import subprocess
import sys
import time

from dlinfra.cli.clock import command_started


def test_the_command_started_when_its_process_did() -> None:
    program = (
        "import time\n"
        "time.sleep(0.5)  # what the CLI's imports take, and more\n"
        "from dlinfra.cli.clock import command_started\n"
        "print(time.time() - command_started())\n"
    )
    before = time.time()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    after = time.time()
    assert done.returncode == 0, done.stderr
    elapsed = float(done.stdout)
    assert 0.5 <= elapsed <= after - before + 0.02, (elapsed, after - before)  # 10 ms ticks


def test_this_process_started_before_now() -> None:
    assert command_started() < time.time() - 0.05  # pytest's own start took longer than that
