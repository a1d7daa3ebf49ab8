"""Address plans: where every node of a cluster listens, known before any node exists.

Local nodes get free loopback ports. AWS nodes get fixed private IPs inside the cluster subnet,
one block per role, so adding a worker never moves the chief or a parameter server (and so
Terraform never replaces them).
"""

from __future__ import annotations

import ipaddress
import random
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from dlinfra.contract import DISPATCHER_PORT_OFFSET, ROLE_ORDER, SubnetLayout
from dlinfra.errors import SpecError
from dlinfra.spec.model import MAX_WORKERS, Spec

# Host numbers inside the subnet for each role's block (AWS reserves .0-.3 and the last address).
HOST_OFFSET = {"chief": 10, "ps": 16, "worker": 128}


@dataclass(frozen=True)
class Node:
    role: str  # TF job name: chief | worker | ps
    index: int
    host: str
    port: int

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class AddressPlan:
    nodes: tuple[Node, ...]
    layout: SubnetLayout | None = None  # the rule the nodes follow, when there is one
    # where the chief's tf.data dispatcher listens, for parameter-server workers that take train files
    # as they are free (TrainingSpec.dispatches_files)
    dispatcher: str | None = None

    def description(self) -> SubnetLayout | dict[str, list[str]]:
        """What each node is told of the cluster: the rule if there is one, else the list."""
        return self.layout or self.cluster()

    def cluster(self) -> dict[str, list[str]]:
        """The TF cluster map: job name → addresses ordered by task index."""
        out: dict[str, list[str]] = {}
        for node in sorted(self.nodes, key=lambda n: (ROLE_ORDER.index(n.role), n.index)):
            out.setdefault(node.role, []).append(node.address)
        return out

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)


def loopback_plan(spec: Spec, first_port: int | None = None) -> AddressPlan:
    """Every node on this machine, each on a loopback port: from `first_port` on (in a namespace
    of the cluster's own, where all are free), else free ones."""
    counts = {role: shape.count for role, shape in spec.roles().items()}
    total = sum(counts.values())
    ports = iter(range(first_port, first_port + total + 1)) if first_port else free_ports(total + 1)
    nodes = [
        Node(role, i, "127.0.0.1", next(ports)) for role in ROLE_ORDER for i in range(counts.get(role, 0))
    ]
    return AddressPlan(tuple(nodes), dispatcher=f"127.0.0.1:{next(ports)}")


def private_ip_plan(spec: Spec) -> AddressPlan:
    """Fixed private IPs in the cluster subnet, one block per role, all on the spec's TF port."""
    subnet = ipaddress.IPv4Network(spec.aws.subnet_cidr)
    need = {role: shape.count for role, shape in spec.roles().items()}
    limits = {"chief": HOST_OFFSET["ps"], "ps": HOST_OFFSET["worker"], "worker": subnet.num_addresses - 1}
    for role in ROLE_ORDER:
        count = need.get(role, 0)
        if HOST_OFFSET[role] + count > limits[role]:
            room = max(0, limits[role] - HOST_OFFSET[role])
            raise SpecError(
                [
                    f"aws.subnet_cidr: {subnet} has room for {room} {role} nodes, the spec asks for "
                    f"{count}. Fix: {_larger_subnet(count)}"
                ]
            )
    layout = SubnetLayout(subnet=str(subnet), port=spec.cluster.port, offsets=HOST_OFFSET, counts=need)
    nodes = tuple(Node(role, i, host, layout.port) for role, i, host in layout.hosts())
    return AddressPlan(nodes, layout, dispatcher=f"{nodes[0].host}:{layout.port + DISPATCHER_PORT_OFFSET}")


def _larger_subnet(workers: int) -> str:
    """The fix for a worker block too small: the smallest subnet size whose block holds them."""
    for prefix in range(28, 15, -1):
        if (room := 2 ** (32 - prefix) - 1 - HOST_OFFSET["worker"]) >= workers:
            return f"use a /{prefix} or larger aws.subnet_cidr (a /{prefix} holds {room} workers)"
    return f"use fewer workers: a /16, the largest subnet AWS allows, holds {MAX_WORKERS}"


# Ports below the kernel's ephemeral range: the kernel hands out ephemeral ports to every outgoing
# connection on the machine, so a free one chosen there can be taken before the node binds it (a CI
# run failed "Could not start gRPC server" that way). Explicit binds below it are rare.
LISTEN_PORTS = (15000, 32768)


def free_ports(count: int) -> Iterator[int]:
    """`count` distinct loopback ports free now, outside the ephemeral range (all held open while
    choosing, so none repeats)."""
    low, high = LISTEN_PORTS[0], min(LISTEN_PORTS[1], _ephemeral_low())
    candidates = random.sample(range(low, high), min(high - low, count * 8)) if high - low > count else []
    with ExitStack() as stack:
        ports: list[int] = []
        for port in [*candidates, *[0] * count]:  # port 0: the kernel's choice, the fallback
            if len(ports) == count:
                break
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(sock.getsockname()[1])
    return iter(ports)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LISTEN_PORTS[1]
