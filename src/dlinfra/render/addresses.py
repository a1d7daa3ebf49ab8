"""Address plans: where every node of a cluster listens, known before any node exists.

Local nodes get free loopback ports. AWS nodes get fixed private IPs inside the cluster subnet,
one block per role, so adding a worker never moves the chief or a parameter server (and so
Terraform never replaces them).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

from dlinfra.errors import SpecError
from dlinfra.spec import Spec

# Host numbers inside the subnet for each role's block (AWS reserves .0-.3 and the last address).
HOST_OFFSET = {"chief": 10, "ps": 16, "worker": 128}
ROLE_ORDER = ("chief", "worker", "ps")


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

    def cluster(self) -> dict[str, list[str]]:
        """The TF cluster map: job name → addresses ordered by task index."""
        out: dict[str, list[str]] = {}
        for node in sorted(self.nodes, key=lambda n: (ROLE_ORDER.index(n.role), n.index)):
            out.setdefault(node.role, []).append(node.address)
        return out

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def by_name(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)


def role_counts(spec: Spec) -> dict[str, int]:
    """Nodes per TF job; multi_worker_mirrored has workers only (worker 0 acts as chief)."""
    if spec.strategy == "multi_worker_mirrored":
        return {"worker": spec.cluster.workers.count}
    return {"chief": 1, "worker": spec.cluster.workers.count, "ps": spec.cluster.ps.count}


def plan_addresses(spec: Spec, target: str | None = None) -> AddressPlan:
    target = target or spec.target
    counts = role_counts(spec)
    if target == "local":
        ports = free_ports(sum(counts.values()))
        nodes = [
            Node(role, i, "127.0.0.1", next(ports)) for role in ROLE_ORDER for i in range(counts.get(role, 0))
        ]
        return AddressPlan(tuple(nodes))
    return AddressPlan(tuple(_private_ip_nodes(spec, counts)))


def _private_ip_nodes(spec: Spec, counts: dict[str, int]) -> list[Node]:
    subnet = ipaddress.IPv4Network(spec.aws.subnet_cidr)
    need = {"chief": counts.get("chief", 0), "ps": counts.get("ps", 0), "worker": counts.get("worker", 0)}
    limits = {"chief": HOST_OFFSET["ps"], "ps": HOST_OFFSET["worker"], "worker": subnet.num_addresses - 1}
    nodes = []
    for role in ROLE_ORDER:
        if HOST_OFFSET[role] + need[role] > limits[role]:
            room = max(0, limits[role] - HOST_OFFSET[role])
            raise SpecError(
                [
                    f"aws.subnet_cidr: {subnet} has room for {room} {role} nodes, the spec asks for "
                    f"{need[role]}. Fix: use a larger subnet (a /22 holds 890 workers)"
                ]
            )
        nodes += [
            Node(role, i, str(subnet.network_address + HOST_OFFSET[role] + i), spec.cluster.port)
            for i in range(need[role])
        ]
    return nodes


def free_ports(count: int) -> Iterator[int]:
    """`count` distinct free loopback ports (all held open while choosing, so none repeats)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    return iter(ports)
