"""Shaped links between local nodes (cluster.local_network: shaped): real namespaces, real TCP.

Rates are modest (tens of Mbit/s) so that a loaded two-core machine's CPU is never what limits a
transfer: what is measured is the tbf on the link."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlinfra.spec.hardware import MIN_SHAPED_BPS
from dlinfra.targets import shaped_network
from dlinfra.targets.shaped_network import ShapedNetwork

PROBLEM = shaped_network.problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no shaped links on this machine: {PROBLEM}")

RATES = {"chief-0": 80e6, "worker-0": 200e6, "ps-0": 50e6}
PORT = 5001
# tbf's first bucketful leaves at full speed: the count starts after SKIP seconds of traffic, and
# the sender keeps sending past the end of the window so the window sees no slowing tail either.
SKIP, WINDOW = 0.5, 3.5

RECEIVER = """
import json, socket, sys, time
skip, window = float(sys.argv[2]), float(sys.argv[3])
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("listening", flush=True)
conn, _ = server.accept()
first = mark = last = None
total = at_mark = at_last = 0
while chunk := conn.recv(1 << 20):
    now = time.monotonic()
    total += len(chunk)
    if first is None:
        first = now
    elif mark is None and now - first >= skip:
        mark, at_mark = now, total
    elif mark is not None and now - first <= skip + window:
        last, at_last = now, total
print(json.dumps({"bytes": at_last - at_mark, "seconds": last - mark}))
"""

SENDER = """
import socket, sys, time
address, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
block = b"x" * 65536
with socket.create_connection((address, port), timeout=10) as conn:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(block)
"""

# From inside a node: writes a file, then says how connecting to each address fails.
# ECONNREFUSED means a node answered.
PROBE = """
import errno, json, socket, sys
open(sys.argv[1], "w").close()
outcome = {}
for address in sys.argv[2:]:
    try:
        socket.create_connection((address, 9), timeout=5).close()
        outcome[address] = "connected"
    except OSError as exc:
        outcome[address] = errno.errorcode.get(exc.errno or 0, repr(exc))
print(json.dumps(outcome))
"""


@pytest.fixture(scope="module")
def network() -> Iterator[ShapedNetwork]:
    net = ShapedNetwork(RATES)
    yield net
    net.close()


def _goodput(net: ShapedNetwork, sender: str, receiver: str) -> float:
    """Bits per second from `sender` to `receiver`, as the receiver counts them."""
    argv = [sys.executable, "-c", RECEIVER, str(PORT), str(SKIP), str(WINDOW)]
    listener = subprocess.Popen(net.command(receiver, argv), stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "listening"
        seconds = str(SKIP + WINDOW + 0.5)
        argv = [sys.executable, "-c", SENDER, net.address(receiver), str(PORT), seconds]
        sent = subprocess.run(net.command(sender, argv), capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        out, _ = listener.communicate(timeout=30)
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
    counted = json.loads(out)
    return counted["bytes"] * 8 / counted["seconds"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sender", "receiver", "bottleneck"),
    [("chief-0", "worker-0", "chief-0"), ("worker-0", "ps-0", "ps-0")],
    ids=["what-a-node-sends", "what-a-node-receives"],
)
def test_a_transfer_runs_within_ten_percent_of_the_slower_link(
    network: ShapedNetwork, sender: str, receiver: str, bottleneck: str
) -> None:
    ratio = _goodput(network, sender, receiver) / RATES[bottleneck]
    print(f"{sender} -> {receiver}: {ratio:.3f} of {RATES[bottleneck] / 1e6:.0f} Mbit/s")
    # tbf's goodput is ~0.96 of its rate: the rest is TCP/IP and Ethernet headers
    assert 0.90 <= ratio <= 1.02


def _hosts_own_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("1.1.1.1", 9))  # no packet leaves: this only picks the outgoing address
        except OSError:
            return None
        address = str(sock.getsockname()[0])
    return None if ipaddress.ip_address(address) in ipaddress.ip_network(shaped_network.SUBNET) else address


def test_nodes_reach_one_another_and_nothing_else(network: ShapedNetwork, tmp_path: Path) -> None:
    reached = [network.address(name) for name in RATES if name != "chief-0"] + ["127.0.0.1"]
    outside = ["1.1.1.1", *filter(None, [_hosts_own_address()])]
    written = tmp_path / "written-by-a-node"
    argv = [sys.executable, "-c", PROBE, str(written), *reached, *outside]
    probed = subprocess.run(network.command("chief-0", argv), capture_output=True, text=True, timeout=60)
    assert probed.returncode == 0, probed.stderr
    outcome = json.loads(probed.stdout)
    # root inside the namespace is the caller outside: what a node writes, the caller owns
    assert written.stat().st_uid == os.getuid()
    assert outcome == {**dict.fromkeys(reached, "ECONNREFUSED"), **dict.fromkeys(outside, "ENETUNREACH")}
    assert len({network.address(name) for name in RATES}) == len(RATES)


def test_close_leaves_no_process_behind() -> None:
    net = ShapedNetwork({"chief-0": 10e6, "worker-0": 10e6})
    pids = [net.holder.pid, *net.pids.values()]
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    net.close()
    net.close()
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []


def test_a_machine_whose_namespaces_refuse_tbf_is_told_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin" / "tc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Error: Specified qdisc kind is unknown.' >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert "qdisc kind is unknown" in (shaped_network.problem() or "")
    with pytest.raises(shaped_network.Unavailable, match="qdisc kind is unknown"):
        ShapedNetwork({"chief-0": 10e6})


def test_the_slowest_link_a_spec_may_ask_for_is_one_tc_makes() -> None:
    """The floor `validate` holds cluster.local_link_scale to (spec.hardware) is a real link; far
    under it tc refuses (1 bit/s: 'the "rate" parameter is mandatory'), after the run was made."""
    net = ShapedNetwork({"chief-0": MIN_SHAPED_BPS, "worker-0": MIN_SHAPED_BPS})
    net.close()
    with pytest.raises(shaped_network.Unavailable, match="tbf"):
        ShapedNetwork({"chief-0": 1.0})
