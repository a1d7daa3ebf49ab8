"""Every process a node started ends with the node (issue 55, class 4), however it detached.

A script that daemonizes (a double fork, `setsid`) leaves its process group and its session, so
signalling the group misses it, and once its parent exits Linux hands it to init: nothing of the
node is its ancestor any more. A cgroup would hold it, but a node runs under whatever the machine
gives (cgroup v1 here, v2 under systemd on EC2, none writable in some containers). So the node's
processes are child subreapers (PR_SET_CHILD_SUBREAPER, Linux 3.4): an orphan of their subtree is
handed to the nearest of them instead of init, and stays their descendant, found by its parent links
in /proc. The agent ends its script's descendants when the script ends (before the model is read: a
daemon left running could still change it), the beacon ends whatever its trainer left (a trainer
killed by its watchdog leaves its script's daemons to the beacon). A descendant cannot leave a
subreaper's subtree, so no environment marker (which a process may clear) is needed."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
TERM_GRACE = 3.0  # SIGTERM first (a daemon may flush what it holds), then SIGKILL
POLL = 0.05


def become_subreaper() -> bool:
    """Orphans of this process's subtree come to it, not to init. False where the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def reap_orphans(keep: int) -> None:
    """Collect the exit of every child but `keep` (its owner's Popen waits for it): an orphan that a
    subreaper inherits and that ends while the node runs would otherwise stay a zombie."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def _table() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, state letter) of every process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
        table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every process below `root`, with its parent and state."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found[pid] = table[pid]
            todo.extend(children.get(pid, []))
    return found


def end_descendants(
    grace: float = TERM_GRACE, within: float = 30.0, keep: frozenset[int] = frozenset()
) -> list[int]:
    """End every process below this one but `keep`: SIGTERM, then SIGKILL after `grace`, until none
    is left (a process forking as it is ended is found at the next look). Returns the pids that were
    running."""
    me = os.getpid()
    ended: list[int] = []
    started = time.monotonic()
    sig = signal.SIGTERM
    while True:
        below = descendants(me)
        for pid, (parent, state) in below.items():
            if parent == me and state == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        alive = [pid for pid, (_, state) in below.items() if state != "Z" and pid not in keep]
        if not alive or time.monotonic() - started > within:
            return ended
        for pid in alive:
            if pid not in ended:
                ended.append(pid)
            for each in (sig, signal.SIGCONT):  # a stopped process acts on SIGTERM once continued
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, each)
        if time.monotonic() - started > grace:
            sig = signal.SIGKILL
        time.sleep(POLL)  # a poll of /proc: a process's exit has no event to wait on here


def die_with_parent() -> None:
    """In a child: if its parent dies (the beacon killed at teardown, the agent by its max_runtime
    watchdog), the child (the trainer, a script) dies too."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
