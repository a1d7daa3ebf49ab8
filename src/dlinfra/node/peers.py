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


# How often the cluster's peers are tried: often at first, since on one machine the last peer serves
# within a second of the chief's TensorFlow, and every poll's wait is the first step's (a fixed 0.5 s
# poll cost local runs 0.25 s on average); then less, as machines boot for minutes.
FIRST_POLL, LAST_POLL = 0.05, 0.5


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
    pause = FIRST_POLL
    while True:
        pending = {addr for addr in pending if not port_open(addr)}
        if not pending:
            return
        if time.monotonic() > deadline:
            raise PeersUnreachable(
                f"peers not reachable after {timeout:.0f}s: {', '.join(sorted(pending))}. Fix: check those "
                "nodes' logs (`dlinfra logs RUN --node NAME`) and that the TF port is open between nodes"
            )
        time.sleep(pause)
        pause = min(LAST_POLL, pause * 1.5)


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
