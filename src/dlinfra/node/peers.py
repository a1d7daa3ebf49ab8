"""Forming the cluster: wait until every TF_CONFIG peer serves, and bound calls that block on peers,
so a missing node is named instead of hanging the trainer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dlinfra.errors import DlinfraError

T = TypeVar("T")


class PeersUnreachable(DlinfraError):
    pass


def port_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def wait_for_peers(peers: list[str], timeout: float) -> None:
    """Block until every peer accepts TCP connections, or fail naming the ones that never did."""
    deadline = time.monotonic() + timeout
    pending = set(peers)
    while True:
        pending = {addr for addr in pending if not port_open(addr)}
        if not pending:
            return
        if time.monotonic() > deadline:
            raise PeersUnreachable(
                f"peers not reachable after {timeout:.0f}s: {', '.join(sorted(pending))}. Fix: check those "
                "nodes' logs (`dlinfra logs RUN --node NAME`) and that the TF port is open between nodes"
            )
        time.sleep(0.5)


def bounded(fn: Callable[[], T], timeout: float, peers: list[str]) -> T:
    result: list[Any] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    if errors:
        raise errors[0]
    if not result:
        missing = [p for p in peers if not port_open(p)] or peers
        raise PeersUnreachable(
            f"cluster did not form within {timeout:.0f}s; unreachable: {', '.join(missing)}. "
            "Fix: check those nodes' logs (`dlinfra logs RUN --node NAME`)"
        )
    return result[0]
