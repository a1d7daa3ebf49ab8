"""Work that a node does at a lower CPU priority than the rest of its process.

Where a cluster's nodes share one machine (a local run), the chief's way to its first step (its
beacon's imports, then `import tensorflow`) is the run's startup, while a parameter-server run's
workers and ps have time to spare: they only have to serve by the time the chief has loaded
TensorFlow. On Linux nice is a thread's own, so such a node does its startup's heavy loads in a
thread of its own at a higher nice, and everything after, started from the main thread, runs at the
process's: nothing that serves or trains is slowed. Raising nice needs no privilege, and nothing
needs to lower it back, since the thread ends. Where nodes have machines of their own, nothing
competes, and a nicer thread runs as fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Set by the local target for the nodes that only serve a parameter-server run: how much nicer their
# beacon loads dlinfra's node modules (node.beacon's imports), so that the chief's beacon, forking
# the chief's trainer, is not one of five equal shares of two cores.
START_NICENESS_ENV = "DLINFRA_START_NICENESS"


def in_nicer_thread(work: Callable[[], T], niceness: int, name: str) -> T:
    """`work`'s result (or its exception), run in a thread `niceness` nicer than the caller's. The
    thread has ended on return: a process may fork after it (node.trainer_process)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) as pool:
        return pool.submit(_nicer, work, niceness).result()


def start_niceness() -> int:
    """What START_NICENESS_ENV asks of this node's start (0: nothing, or not a number)."""
    value = os.environ.get(START_NICENESS_ENV, "")
    return int(value) if value.isdigit() else 0


def _nicer(work: Callable[[], T], niceness: int) -> T:
    if niceness and sys.platform == "linux":  # elsewhere a thread's id is no process's
        me = threading.get_native_id()
        with contextlib.suppress(OSError):  # a hint: never a reason not to start
            os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + niceness)
    return work()
