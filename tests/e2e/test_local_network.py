"""A local run's TensorFlow ports are reachable from its own cluster alone.

TensorFlow's gRPC server listens on every interface with no authentication. A local cluster
therefore lives in a private network namespace (cluster.local_network: auto → private). These
tests hold a real run up, find its nodes' ports listening, and try them from this machine on
every address it has. `host` is the control: the same probe reaches the ports, so the probe can
tell exposure from isolation."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

_SIOCGIFADDR = 0x8915


def machine_addresses() -> list[str]:
    """Every IPv4 address of this machine's interfaces, loopback included."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                reply = fcntl.ioctl(sock, _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # an interface without an IPv4 address
            found.append(socket.inet_ntoa(reply[20:24]))
    return found


def connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _held_up_run(tmp_path: Path, network: str) -> Iterator[tuple[Path, dict[str, int]]]:
    """A detached run training for long, once every node says its TF port is open; destroyed after."""
    env = dict(os.environ, DLINFRA_HOME=str(tmp_path / "home"))
    started = run_cli(
        "deploy", "--workers", "1", "--steps", "1000000", "--detach",
        "--set", f"cluster.local_network={network}", env=env, cwd=tmp_path,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    [run_dir] = (tmp_path / "home" / "runs").iterdir()
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["network"] == network
        ports = {
            f"{job}-{i}": int(address.rsplit(":", 1)[1])
            for job, addresses in manifest["addresses"].items()
            for i, address in enumerate(addresses)
        }
        deadline = time.monotonic() + 300
        while not all(_port_open(run_dir, node) for node in ports):
            assert time.monotonic() < deadline, "the nodes' TF ports did not open in 300 s"
            time.sleep(0.5)
        yield run_dir, ports
    finally:
        destroyed = run_cli("destroy", run_dir.name, env=env, cwd=tmp_path)
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr


def _port_open(run_dir: Path, node: str) -> bool:
    path = run_dir / "store" / "status" / f"{node}.json"
    return path.exists() and json.loads(path.read_text()).get("port_open") is True


def _reached_from_inside(run_dir: Path, port: int) -> bool:
    """Connect from inside the run's namespace (entered through its chief's process)."""
    pid = json.loads((run_dir / "manifest.json").read_text())["pids"]["chief-0"]
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3).close()"
    inside = subprocess.run(
        ["nsenter", "--preserve-credentials", "--user", "--net", f"--target={pid}", "python3", "-c", probe],
        capture_output=True,
        text=True,
        check=False,
    )
    return inside.returncode == 0


def test_a_private_runs_ports_answer_inside_its_namespace_and_nowhere_on_this_machine(
    tmp_path: Path,
) -> None:
    addresses = machine_addresses()
    assert "127.0.0.1" in addresses
    with _held_up_run(tmp_path, "private") as (run_dir, ports):
        for node, port in ports.items():
            assert _reached_from_inside(run_dir, port), f"{node}'s port {port} is not listening"
            reached = [host for host in addresses if connects(host, port)]
            assert reached == [], f"{node}'s TF port {port} answers on {reached} outside its namespace"


def test_a_host_network_runs_ports_answer_on_every_address_of_this_machine(tmp_path: Path) -> None:
    """The control: without the namespace TensorFlow listens on 0.0.0.0, and the probe sees it."""
    addresses = machine_addresses()
    with _held_up_run(tmp_path, "host") as (_, ports):
        for node, port in ports.items():
            unreached = [host for host in addresses if not connects(host, port)]
            assert unreached == [], f"{node}'s TF port {port} does not answer on {unreached}"


FETCHING_PROGRAM = '''
"""User code that fetches its data from the network when the program is built."""
import socket


def program(training):
    socket.create_connection(("192.0.2.1", 443), timeout=10)  # TEST-NET-1: never a real host
    raise AssertionError("unreachable: the connection above cannot succeed")
'''


def test_user_code_that_needs_the_network_in_a_private_run_is_told_how_to_get_it(tmp_path: Path) -> None:
    (tmp_path / "fetching_program.py").write_text(FETCHING_PROGRAM)
    spec = tmp_path / "experiment.yaml"
    spec.write_text(
        "name: fetches\nstrategy: multi_worker_mirrored\ncluster: {workers: {count: 1}}\n"
        "training: {entrypoint: fetching_program.py:program, steps: 10}\n"
    )
    result = run_cli(
        "deploy", str(spec), env=dict(os.environ, DLINFRA_HOME=str(tmp_path / "home")), cwd=tmp_path
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Network is unreachable" in result.stderr
    assert "set cluster.local_network: host" in result.stderr


SHAPED = """\
name: shaped
cluster:
  chief: {instance_type: c5.4xlarge}
  workers: {count: 2, instance_type: c5.4xlarge}
  ps: {count: 1, instance_type: c5.4xlarge}
  local_network: shaped
  local_link_scale: 0.02
training:
  model: {name: mlp, hidden_units: [512, 512]}
  batch_size: 16
  steps: 40
  checkpoint_every: 100000
"""


def test_a_detached_shaped_run_keeps_its_links_after_the_cli_left_and_records_its_prediction(
    tmp_path: Path,
) -> None:
    """Each node on its own address of the bridge, its link shaped (tests/test_shaped_network.py
    measures the rate). The CLI that made the bridge exits at once (--detach): the links must live
    on while the nodes are inside, or the nodes could not reach one another and the run would stall.
    The run then ends DONE under `dlinfra watch`, its throughput recorded beside the prediction."""
    (tmp_path / "experiment.yaml").write_text(SHAPED)
    env = dict(os.environ, DLINFRA_HOME=str(tmp_path / "home"))
    started = run_cli("deploy", "experiment.yaml", "--detach", env=env, cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    assert (
        "network: shaped (a namespace per node, each link at chief 100 Mb/s"
        in started.stdout + started.stderr
    )
    [run_dir] = (tmp_path / "home" / "runs").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["network"] == "shaped"
    assert manifest["addresses"] == {
        "chief": ["10.77.0.2:12000"],
        "worker": ["10.77.0.3:12000", "10.77.0.4:12000"],
        "ps": ["10.77.0.5:12000"],
    }
    watched = run_cli("watch", run_dir.name, env=env, cwd=tmp_path, timeout=600)
    assert watched.returncode == 0 and "DONE" in watched.stdout, watched.stdout + watched.stderr
    predicted = json.loads((run_dir / "store" / "sizing.json").read_text())
    assert predicted["bound"] == "ps NIC" and predicted["workers"] == 2, predicted
    history = run_cli("advise", "experiment.yaml", "--history", env=env, cwd=tmp_path, check=True)
    assert run_dir.name in history.stdout and "mean absolute error" in history.stdout, history.stdout
