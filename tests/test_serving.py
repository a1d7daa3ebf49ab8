"""A parameter-server run's serving node loads TensorFlow's gRPC server alone (node.serving), not its
API, Keras or scikit-learn: measured in a fresh process, against the full load as the control."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, socket, sys
from dlinfra.node import serving
from dlinfra.render.addresses import free_ports
port = next(free_ports(1))
server = serving.start_server({"ps": [f"127.0.0.1:{port}"]}, "ps", 0, 2, lean=sys.argv[1] == "lean")
with socket.create_connection(("127.0.0.1", port), timeout=5):
    answers = True
heavy = sorted(m for m in ("keras", "sklearn", "scipy", "tensorflow.python.keras") if m in sys.modules)
print(json.dumps({"answers": answers, "heavy": heavy, "target": server.target}))
"""


@pytest.mark.parametrize("mode", ["lean", "full"])
def test_a_lean_server_serves_without_keras_or_scikit_learn(mode: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["answers"] and found["target"].startswith("grpc://127.0.0.1:")
    if mode == "lean":
        assert found["heavy"] == [], found
    else:  # the control: a plain TensorFlow import brings them, so the check above can fail
        assert "keras" in found["heavy"] and "sklearn" in found["heavy"], found
