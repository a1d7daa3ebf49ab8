"""A private network for one local cluster.

TensorFlow's gRPC server listens on every interface (`0.0.0.0:<port>`, no authentication, no
option to bind loopback), so while a local run is up anyone who can reach this machine could run
TensorFlow ops as its user, reading and writing files. Each local cluster therefore lives in its
own network namespace, made by an unprivileged user namespace (no root needed): its nodes see one
another on its own loopback, and nothing outside the namespace can reach them, not even this
machine's other processes. A side effect: every port inside is free, so node ports are fixed.

The namespace has no route out. A run whose nodes must reach the network (an s3:// store, a remote
dataset) shares this machine's network instead, and says so (`cluster.local_network`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dlinfra.errors import SpecError

if TYPE_CHECKING:
    from dlinfra.spec.model import Spec

# Inside a fresh namespace every port is free: ports are fixed, so no two clusters race for one.
# Below the range host-network runs draw from (addresses.LISTEN_PORTS), so a port seen answering on
# this machine is never mistaken for a private node's.
FIRST_PORT = 12000
HOLDER = Path(__file__).with_name("namespace_holder.py")  # stdlib only: run without dlinfra's imports
_ENTER = ("--preserve-credentials", "--user", "--net")
NAMESPACES_OFF_FIX = (
    "enable unprivileged user namespaces (Ubuntu: sysctl kernel.apparmor_restrict_unprivileged_userns=0; "
    "others: sysctl user.max_user_namespaces=15000), or set cluster.local_network: host"
)


class Unavailable(Exception):
    """This machine cannot make a private network namespace; the message says why."""


def needs_host_network(spec: Spec) -> str | None:
    """Why the nodes of this run must reach beyond their cluster, or None."""
    if spec.storage.url and spec.storage.url.startswith("s3://"):
        return f"storage.url {spec.storage.url} is written by the nodes"
    ds = spec.training.dataset
    for field, uri in (("uri", ds.uri), ("eval_uri", ds.eval_uri)):
        if uri and not uri.startswith("file://"):
            return f"training.dataset.{field} {uri} is fetched by the nodes"
    return None


@dataclass(frozen=True)
class Choice:
    private: bool
    why: str  # one line for the plan: what the nodes' network is and why
    shaped: bool = False  # a namespace per node, its link shaped (targets.shaped_network)

    @property
    def name(self) -> str:
        return "shaped" if self.shaped else "private" if self.private else "host"


class NodeNetwork(Protocol):
    """Where a local cluster's nodes run: one namespace for all, or one each (shaped)."""

    def command(self, name: str, argv: list[str]) -> list[str]: ...

    def close(self) -> None: ...


def choose(spec: Spec) -> Choice:
    """The network a local run gets; `cluster.local_network: private` that cannot be had is an error."""
    wanted = spec.cluster.local_network
    exposed = "TensorFlow's servers listen on every interface of this machine while the run is up"
    if wanted == "host":
        return Choice(False, f"network: host (cluster.local_network: host): {exposed}")
    reason = needs_host_network(spec)
    unavailable = None if reason else problem()
    if wanted == "private" and (reason or unavailable):
        fix = (
            "use a file:// store and dataset, or set cluster.local_network: host"
            if reason
            else NAMESPACES_OFF_FIX
        )
        raise SpecError([f"cluster.local_network: private, but {reason or unavailable}. Fix: {fix}"])
    if reason or unavailable:
        return Choice(False, f"network: host ({reason or unavailable}): {exposed}")
    return Choice(True, "network: private (the cluster's own namespace; its ports unreachable from outside)")


def problem() -> str | None:
    """Why a private namespace cannot be made here, or None."""
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} (util-linux) not found"
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        detail = probe.stderr.strip().splitlines()[-1:] or [f"exit {probe.returncode}"]
        return f"user namespaces are not available to this user ({detail[0]})"
    return None


class Namespace:
    """A network namespace kept alive by a holder process while the CLI runs; nodes enter it.

    The holder leaves when its stdin closes (the CLI ended or stopped it). The namespace lives on
    while any node is inside, so a detached run keeps its network after the CLI has gone."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-I", "-S", str(HOLDER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C reaches the CLI, which closes the namespace itself
        )
        assert self.holder.stdout is not None
        ready = self.holder.stdout.readline()
        if ready.strip() != b"ready":
            detail = release(self.holder)
            raise Unavailable(f"the namespace holder did not start: {detail[-300:] or 'no output'}")

    def command(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace, whichever node `name` is (nsenter execs it: the pid is
        argv's own)."""
        return ["nsenter", *_ENTER, f"--target={self.holder.pid}", "--", *argv]

    def close(self) -> None:
        release(self.holder)


def release(holder: subprocess.Popen[bytes]) -> str:
    """Let a namespace holder go (its stdin closes), kill its session if it has not gone in 5 s (a
    shaped network's node holders share it), and close its pipes; what it said on stderr. Closing
    twice is harmless."""
    if holder.poll() is None:
        with contextlib.suppress(OSError):
            assert holder.stdin is not None
            holder.stdin.close()
        try:
            holder.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(holder.pid, signal.SIGKILL)  # started with a session of its own
            holder.wait()
    said = holder.stderr.read() if holder.stderr is not None and not holder.stderr.closed else b""
    for pipe in (holder.stdin, holder.stdout, holder.stderr):
        if pipe is not None:
            pipe.close()
    return said.decode(errors="replace").strip()
