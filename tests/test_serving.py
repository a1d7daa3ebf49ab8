"""A parameter-server run's serving node loads TensorFlow's gRPC server alone (node.serving), not its
API, Keras or scikit-learn: measured in a fresh process, against the full load as the control. It
loads it at a lower CPU priority than the chief's import (serving.LOAD_NICENESS), and serves at its
process's: every thread it has once it serves runs at the process's nice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlinfra.node.serving import LOAD_NICENESS

PROBE = """
import glob, json, os, socket, sys, threading, time

class Loads:  # the nice of the thread that loads the server's module
    def find_spec(self, name, path, target=None):
        if name == "tensorflow.python.training.server_lib":
            loads.append(threading.get_native_id())
            nice["load"] = os.getpriority(os.PRIO_PROCESS, loads[-1])
        return None

def nices():
    found = set()
    for task in glob.glob(f"/proc/{os.getpid()}/task/*/stat"):
        try:
            found.add(int(open(task).read().rsplit(")", 1)[1].split()[16]))  # proc(5): field 19, nice
        except FileNotFoundError:  # a thread that ended since the listing
            pass
    return sorted(found)

loads = []

nice = {"process": os.getpriority(os.PRIO_PROCESS, 0)}
sys.meta_path.insert(0, Loads())
from dlinfra.node import serving
from dlinfra.render.addresses import free_ports
port = next(free_ports(1))
server = serving.start_server({"ps": [f"127.0.0.1:{port}"]}, "ps", 0, 2, lean=sys.argv[1] == "lean")
with socket.create_connection(("127.0.0.1", port), timeout=5):
    answers = True
heavy = sorted(m for m in ("keras", "sklearn", "scipy", "tensorflow.python.keras") if m in sys.modules)
# A joined thread can stay in the task list a moment after Python's join (at nice +10, under load,
# longer): the load's thread is waited out, then every thread left is one that serves.
loader = f"/proc/{os.getpid()}/task/{loads[0]}" if loads and loads[0] != threading.get_native_id() else ""
deadline = time.monotonic() + 120
while loader and os.path.exists(loader) and time.monotonic() < deadline:
    time.sleep(0.05)
nice["loader left"] = not (loader and os.path.exists(loader))
nice["threads"] = nices()
print(json.dumps({"answers": answers, "heavy": heavy, "target": server.target, "nice": nice}))
"""


@pytest.mark.parametrize("mode", ["lean", "full"])
def test_a_lean_server_serves_without_keras_or_scikit_learn(mode: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["answers"] and found["target"].startswith("grpc://127.0.0.1:")
    nice = found["nice"]
    assert nice["loader left"], "the thread that loaded the server never ended"
    assert nice["threads"] == [nice["process"]], "a thread serves at a lower priority than its process"
    if mode == "lean":
        assert found["heavy"] == [], found
        assert nice["load"] == nice["process"] + LOAD_NICENESS, nice
    else:  # the control: a plain TensorFlow import brings them, so the check above can fail
        assert "keras" in found["heavy"] and "sklearn" in found["heavy"], found
