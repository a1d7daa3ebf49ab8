"""Shaped links between the local nodes of one cluster (`cluster.local_network: shaped`).

On one machine the nodes of a cluster talk over loopback, which moves gigabytes a second: a
parameter-server run whose step time is bound by the network on real instances looks compute-bound
here, and a plan's prediction of that bound cannot be checked. So each local node gets its own
network namespace, all joined to one bridge by veth pairs, and each node's link is shaped with tbf
in both directions to the bandwidth of its instance type's NIC: TensorFlow's gRPC traffic between
nodes then crosses a link of that size, and the parameter-server bound shows on one machine.

Bandwidth only: latency cannot be emulated, since netem (the qdisc that delays) is not available to
unprivileged namespaces here. As with the private network, nothing outside can reach the nodes and
they have no route out. No root needed: a holder process is root in a user namespace of its own and
makes the bridge in its network namespace; each node's namespace is held by a child made with
`unshare --net`, which stays in that user namespace, so the holder may plumb veths into it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from dlinfra.contract import ROLE_ORDER
from dlinfra.errors import SpecError
from dlinfra.render import AddressPlan
from dlinfra.render.addresses import Node
from dlinfra.spec.catalog import catalog
from dlinfra.targets import private_network

if TYPE_CHECKING:
    from dlinfra.spec.model import Spec

SUBNET = "10.77.0.0/24"
# .1 is left for the bridge, which needs no address: the nodes talk across it at layer 2.
_HOSTS = [f"10.77.0.{i}" for i in range(2, 255)]
# `python -m` runs this module as __main__, so the node holders it spawns must be told its real name.
_MODULE = "dlinfra.targets.shaped_network"
_ENTER = ("--preserve-credentials", "--user", "--net")
_UNSHARE = ("unshare", "--user", "--map-root-user", "--net")
# The bucket must hold what the link sends in a timer tick (CONFIG_HZ=250) and a whole 64 kB GSO
# packet: smaller buckets starve TCP (measured: 1600 B gave nothing at 1 Gb/s, 2000 B a third of it).
_TICKS_PER_SECOND, _MIN_BURST = 250, 64 * 1024
# tbf needs a queue bound; tens of ms of queue is what a NIC's ring holds, and TCP paces itself to it.
_LATENCY = "50ms"
_LINGER_POLL = 1.0  # seconds: how soon the links go once the last node left (a scan of /proc each)


class Unavailable(Exception):
    """This machine cannot make the shaped network; the message says why."""


def choose(spec: Spec) -> private_network.Choice:
    """The shaped network, or a clear refusal: it is private too (no route out), and each node's
    type must be in the catalog, whose baseline bandwidth its link gets."""
    problems = []
    if reason := private_network.needs_host_network(spec):
        problems.append(
            f"{reason}, and a shaped network has no route out. Fix: use a file:// store and dataset"
        )
    unknown = sorted(
        {s.instance_type for s in spec.roles().values() if catalog().get(s.instance_type) is None}
    )
    if unknown:
        problems.append(
            f"{', '.join(unknown)} not in the catalog, so no bandwidth to shape to. Fix: a type `dlinfra "
            "instances` lists"
        )
    if not problems and (unavailable := problem()):
        problems.append(f"{unavailable}. Fix: {private_network.NAMESPACES_OFF_FIX}")
    if problems:
        raise SpecError([f"cluster.local_network: shaped, but {p}" for p in problems])
    rates = ", ".join(f"{role} {rate / 1e6:g} Mb/s" for role, rate in role_rates(spec).items())
    return private_network.Choice(True, f"network: shaped (a namespace per node, each link at {rates})", True)


def role_rates(spec: Spec) -> dict[str, float]:
    """Role → bits/s each way: its type's baseline bandwidth times cluster.local_link_scale."""
    scale = spec.cluster.local_link_scale
    return {
        role: scale * 1e9 * catalog().by_name[shape.instance_type].network_baseline_gbps
        for role, shape in spec.roles().items()
    }


def address_plan(spec: Spec) -> AddressPlan:
    """A host a node on the bridge, in the order ShapedNetwork numbers them (ROLE_ORDER); one port,
    free in every namespace; the chief's tf.data dispatcher beside its server."""
    counts = {role: shape.count for role, shape in spec.roles().items()}
    names = [(role, i) for role in ROLE_ORDER for i in range(counts.get(role, 0))]
    port = private_network.FIRST_PORT
    nodes = tuple(Node(role, i, _HOSTS[k], port) for k, (role, i) in enumerate(names))
    return AddressPlan(nodes, dispatcher=f"{nodes[0].host}:{port + 1}")


def network_for(spec: Spec, plan: AddressPlan) -> private_network.NodeNetwork:
    rates = role_rates(spec)
    return ShapedNetwork({node.name: rates[node.role] for node in plan.nodes})


def _tool(name: str) -> str | None:
    # iproute2 lives in /usr/sbin, which an ordinary user's PATH often lacks.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _tbf(bits_per_second: float) -> list[str]:
    burst = max(int(bits_per_second / 8 / _TICKS_PER_SECOND), _MIN_BURST)
    return ["tbf", "rate", f"{int(bits_per_second)}bit", "burst", str(burst), "latency", _LATENCY]


def problem() -> str | None:
    """Why shaped links cannot be made here, or None."""
    missing = [tool for tool in ("ip", "tc") if _tool(tool) is None]
    if missing:
        return f"{' and '.join(missing)} (iproute2) not found"
    unavailable = private_network.problem()
    if unavailable:
        return unavailable
    ip, tc = (shlex.quote(str(_tool(tool))) for tool in ("ip", "tc"))
    script = (
        f"{ip} link add dlv0 type veth peer name dlv1 && {ip} link add dlbr0 type bridge && "
        f"{tc} qdisc add dev dlv0 root {shlex.join(_tbf(1e6))}"
    )
    probe = subprocess.run([*_UNSHARE, "sh", "-c", script], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        detail = probe.stderr.strip().splitlines()[-1:] or [f"exit {probe.returncode}"]
        return f"a user namespace here cannot make veth pairs, a bridge or a tbf qdisc ({detail[0]})"
    return None


class ShapedNetwork:
    """One bridge namespace (a holder process), one namespace per node joined to the bridge.

    The holder leaves when its stdin closes (the CLI ended or closed it), and takes the node
    namespaces' holders with it; a namespace lives on while a node process is still inside."""

    def __init__(self, rates: dict[str, float]) -> None:
        """rates: node name -> bits per second, both directions. Built before this returns."""
        if not 0 < len(rates) <= len(_HOSTS):
            raise ValueError(f"between 1 and {len(_HOSTS)} nodes, not {len(rates)}")
        if any(not rate > 0 for rate in rates.values()):
            raise ValueError(f"every rate must be positive: {rates}")
        self._addresses = dict(zip(rates, _HOSTS, strict=False))
        request = [[self._addresses[name], float(rate)] for name, rate in rates.items()]
        self.pids: dict[str, int] = {}  # node name -> the pid holding its namespace
        try:
            self.holder = subprocess.Popen(
                [*_UNSHARE, sys.executable, "-m", _MODULE, json.dumps(request)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C reaches the CLI, which closes the network itself
            )
        except OSError as exc:
            raise Unavailable(f"the network holder could not start: {exc}") from exc
        assert self.holder.stdout is not None
        try:
            pids = json.loads(self.holder.stdout.readline() or "null")
        except ValueError:
            pids = None
        if not (isinstance(pids, list) and len(pids) == len(rates)):
            detail = private_network.release(self.holder)
            raise Unavailable(f"the shaped network was not made: {detail[-300:] or 'no output'}")
        self.pids = dict(zip(rates, pids, strict=True))

    def address(self, name: str) -> str:
        """The node's IPv4 address on the bridge (no port)."""
        return self._addresses[name]

    def command(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside the node's namespace (nsenter execs it: the pid is argv's own)."""
        return ["nsenter", *_ENTER, f"--target={self.pids[name]}", "--", *argv]

    def close(self) -> None:
        """Tear everything down: the node holders share the holder's session."""
        private_network.release(self.holder)


def _run(argv: list[str], script: str | None = None) -> None:
    done = subprocess.run(argv, input=script, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)}: {done.stderr.strip() or f'exit {done.returncode}'}")


def _linger(holders: set[int]) -> None:
    """While a process other than the namespaces' holders is in one of them: a detached run's nodes
    outlive the CLI, and their links must too (the veths die with this, the bridge's namespace)."""
    spaces = {_net_of(pid) for pid in holders} - {None}
    while any(pid not in holders and _net_of(pid) in spaces for pid in _pids()):
        time.sleep(_LINGER_POLL)


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _net_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:  # gone, or not ours to read
        return None


def _hold(request: list[list[float | str]]) -> None:
    """In the bridge's namespace: make the bridge and one shaped node per request, then wait."""
    ip, tc = str(_tool("ip")), str(_tool("tc"))
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        _run([ip, "-batch", "-"], "link set lo up\nlink add br0 type bridge\nlink set br0 up\n")
        for i, (address, rate) in enumerate(request):
            node = subprocess.Popen(
                ["unshare", "--net", sys.executable, "-m", _MODULE, "--node"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            nodes.append(node)
            assert node.stdout is not None
            ready = node.stdout.readline().decode(errors="replace").strip()
            if ready != "ready":
                raise RuntimeError(f"a node's namespace was not made: {ready or 'no output'}")
            side = f"dlv{i}"  # the bridge's end; the node's end is eth0 in its own namespace
            plumb = f"link add {side} type veth peer name eth0 netns {node.pid}\nlink set {side} master br0\n"
            _run([ip, "-batch", "-"], f"{plumb}link set {side} up\n")
            _run([tc, "qdisc", "add", "dev", side, "root", *_tbf(float(rate))])  # what the node receives
            inside = ["nsenter", "--net", f"--target={node.pid}", "--"]
            addressed = f"link set lo up\naddr add {address}/24 dev eth0\nlink set eth0 up\n"
            _run([*inside, ip, "-batch", "-"], addressed)
            _run([*inside, tc, "qdisc", "add", "dev", "eth0", "root", *_tbf(float(rate))])  # what it sends
        print(json.dumps([node.pid for node in nodes]), flush=True)
        sys.stdin.buffer.read()  # until the CLI closes the pipe or exits
        _linger({node.pid for node in nodes})
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
    finally:
        for node in nodes:
            with contextlib.suppress(OSError):
                assert node.stdin is not None
                node.stdin.close()
        for node in nodes:
            try:
                node.wait(5)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()


if __name__ == "__main__":
    if sys.argv[1:] == ["--node"]:
        print("ready", flush=True)
        sys.stdin.buffer.read()  # until the bridge's holder closes the pipe or exits
    else:
        _hold(json.loads(sys.argv[1]))
