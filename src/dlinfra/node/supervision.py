"""How a node agent ends, and whether its supervisor starts it again.

One contract for both supervisors: systemd on EC2 (`Restart=on-failure` with
`RestartPreventExitStatus` built from NO_RESTART_EXIT_CODES) and the local launcher (`should_restart`).
The agent itself counts its restarts in the store, backs off, and gives up after `max_restarts`,
so both supervisors can simply restart whatever did not end for good.

A node interrupted by a spot notice (EXIT_INTERRUPTED) is not restarted in place: its machine is
going away. It is replaced (`is_replaced`): by the watcher's targeted re-apply on EC2, by a fresh
process from the local launcher.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from dlinfra.contract import EXIT_INTERRUPTED, NO_RESTART_EXIT_CODES

# TensorFlow's errors for a peer that vanished or restarted (a killed ps, a lost all-reduce member).
# Everything else — a bug in user code, bad data, an OOM — fails the run instead of looping.
TRANSIENT_TF_ERRORS = ("UnavailableError", "AbortedError", "DeadlineExceededError", "CancelledError")

MAX_BACKOFF_SECONDS = 30.0
# A supervisor's word to a node's next life on why it ended this one (the local launcher restarting a
# healthy member with its mirrored cluster): the node itself had no chance to say
RESTART_CAUSE_FILE = "restart-cause.json"


# As systemd's Restart=on-failure: being told to stop (TERM, INT, HUP, PIPE) is a clean end.
CLEAN_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)


def should_restart(exit_code: int | None) -> bool:
    """A process killed by any other signal (negative code: KILL, SEGV, ABRT…) or asking for a retry
    is started again."""
    if exit_code is None or exit_code in NO_RESTART_EXIT_CODES:
        return False
    return exit_code > 0 or -exit_code not in CLEAN_STOP_SIGNALS


def is_replaced(exit_code: int | None) -> bool:
    """The node left its machine ahead of a spot reclaim: start it again on another one."""
    return exit_code == EXIT_INTERRUPTED


def backoff_seconds(restarts: int) -> float:
    """1, 2, 4, … seconds before the n-th restart trains again: a crash loop must not spin."""
    return 0.0 if restarts <= 0 else min(2.0 ** (restarts - 1), MAX_BACKOFF_SECONDS)


def is_transient(exc: BaseException) -> bool:
    tf = sys.modules.get("tensorflow")
    if tf is None:  # TensorFlow never loaded: the error cannot have come from a peer
        return False
    transient = tuple(getattr(tf.errors, name) for name in TRANSIENT_TF_ERRORS)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:  # the coordinator wraps remote errors
        if isinstance(current, transient):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


def note_restart_cause(work: Path, cause: str) -> None:
    """Before the supervisor ends a node that did not fail, to start it again."""
    work.mkdir(parents=True, exist_ok=True)
    (work / RESTART_CAUSE_FILE).write_text(json.dumps({"cause": cause, "at": time.time()}), encoding="utf-8")


def restart_cause(work: Path) -> tuple[str, float] | None:
    """The supervisor's word on why the last life ended, and when (read once: it is this life's)."""
    path = work / RESTART_CAUSE_FILE
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        path.unlink()
        return str(found["cause"]), float(found["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
