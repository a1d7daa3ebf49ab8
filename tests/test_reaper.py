"""The node's process reaper (issue 55, class 4) without a cluster: what a killed trainer's script
daemonized is ended by the beacon above it. Real processes: a node stand-in that is a subreaper, an
agent stand-in that daemonizes a child ignoring SIGTERM and is then killed by SIGKILL, as the
max_runtime watchdog kills a trainer. The real runs are in tests/e2e (test_script_failures.py, and on
emulated instances test_script_mode.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

NODE = """
import json, os, signal, subprocess, sys, time
from dlinfra.node import reaper

assert reaper.become_subreaper()
agent = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
daemon = int(agent.stdout.readline())
os.kill(agent.pid, signal.SIGKILL)
agent.wait()
adopted = reaper.descendants(os.getpid())
started = time.monotonic()
ended = reaper.end_descendants(grace=0.5)
print(json.dumps({
    "daemon": daemon,
    "adopted": daemon in adopted,
    "ended": ended,
    "left": list(reaper.descendants(os.getpid())),
    "seconds": time.monotonic() - started,
}))
"""

AGENT = """
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it
        print(os.getpid(), flush=True)
        while True:
            time.sleep(60)
    os._exit(0)
os.wait()
time.sleep(60)
"""


def test_a_daemon_that_ignores_sigterm_is_adopted_and_ended_after_its_agent_is_killed(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NODE, AGENT], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["adopted"], "the orphaned daemon came to the subreaper, not to init"
    assert found["ended"] == [found["daemon"]] and found["left"] == []
    assert found["seconds"] < 10
    assert not Path(f"/proc/{found['daemon']}").exists() or "Z" in _state(found["daemon"])


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
