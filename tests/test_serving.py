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
import glob, json, os, socket, sys, threading

class Loads:  # the nice of the thread that loads the server's module
    def find_spec(self, name, path, target=None):
        if name == "tensorflow.python.training.server_lib":
            nice["load"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return None

nice = {"process": os.getpriority(os.PRIO_PROCESS, 0)}
sys.meta_path.insert(0, Loads())
from dlinfra.node import serving
from dlinfra.render.addresses import free_ports
port = next(free_ports(1))
server = serving.start_server({"ps": [f"127.0.0.1:{port}"]}, "ps", 0, 2, lean=sys.argv[1] == "lean")
with socket.create_connection(("127.0.0.1", port), timeout=5):
    answers = True
heavy = sorted(m for m in ("keras", "sklearn", "scipy", "tensorflow.python.keras") if m in sys.modules)
stats = [open(t).read().rsplit(")", 1)[1].split() for t in glob.glob(f"/proc/{os.getpid()}/task/*/stat")]
nice["threads"] = sorted({int(fields[16]) for fields in stats})  # proc(5): the 19th field, nice
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
    assert nice["threads"] == [nice["process"]], "a thread serves at a lower priority than its process"
    if mode == "lean":
        assert found["heavy"] == [], found
        assert nice["load"] == nice["process"] + LOAD_NICENESS, nice
    else:  # the control: a plain TensorFlow import brings them, so the check above can fail
        assert "keras" in found["heavy"] and "sklearn" in found["heavy"], found
