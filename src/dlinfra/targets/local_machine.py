"""What this machine leaves for a local cluster: CPUs, memory, processes and threads, open files.

Read from /proc, the cgroup the CLI runs in, and its resource limits, which every node inherits.
The roots are parameters so that tests can hand in a made-up machine's files.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
# What a cgroup or rlimit file says for "no limit" is some huge number (cgroup v1: 2**63 - 4096).
UNLIMITED = 2**62


@dataclass(frozen=True)
class Limit:
    available: int
    what: str  # where the figure comes from, as a person would look it up
    fix: str = ""  # how to raise it, where one may

    @classmethod
    def tightest(cls, limits: list[Limit], default: Limit) -> Limit:
        return min(limits, key=lambda limit: limit.available, default=default)


NO_LIMIT = Limit(UNLIMITED, "no limit found")


@dataclass(frozen=True)
class Machine:
    cpus: int
    memory: Limit  # bytes new processes may take
    tasks: Limit  # processes and threads that may still start (Linux counts threads as tasks)
    open_files: Limit  # file descriptors each process may hold (RLIMIT_NOFILE)


def read_machine(proc: Path = PROC, cgroup: Path = CGROUP) -> Machine:
    return Machine(_cpus(proc, cgroup), _memory(proc, cgroup), _tasks(proc, cgroup), _open_files())


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().split()[0]
    except (OSError, IndexError):
        return None
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int:
    """One field of a cgroup's memory.stat (0 if absent)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    return next((int(v) for k, _, v in (line.partition(" ") for line in lines) if k == key), 0)


def _cgroup_dirs(proc: Path, cgroup: Path, controller: str) -> list[Path]:
    """The CLI's cgroup of `controller` and each ancestor that can be read: a limit anywhere above
    binds too. Unified (v2) hierarchies have one tree for every controller."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return []
    v2 = (cgroup / "cgroup.controllers").exists()
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (v2 and controllers == "") or (not v2 and controller in controllers.split(",")):
            root = cgroup if v2 else cgroup / controller
            parts = Path(path).parts[1:]
            dirs = [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
            return [d for d in dirs if d.is_dir()]
    return []


def _cpus(proc: Path, cgroup: Path) -> int:
    cpus = len(os.sched_getaffinity(0))
    for d in _cgroup_dirs(proc, cgroup, "cpu"):
        quota, period = _read_int(d / "cpu.cfs_quota_us"), _read_int(d / "cpu.cfs_period_us")
        if (d / "cpu.max").exists():  # v2: "QUOTA PERIOD" or "max PERIOD"
            fields = (d / "cpu.max").read_text().split()
            quota, period = (int(fields[0]) if fields[0] != "max" else None), int(fields[1])
        if quota and quota > 0 and period:
            cpus = min(cpus, max(1, -(-quota // period)))
    return cpus


def _memory(proc: Path, cgroup: Path) -> Limit:
    found = []
    meminfo = _meminfo(proc)
    if "MemAvailable" in meminfo:
        found.append(Limit(meminfo["MemAvailable"], "MemAvailable in /proc/meminfo"))
    for d in _cgroup_dirs(proc, cgroup, "memory"):
        v2 = (d / "memory.max").exists()
        limit = _read_int(d / ("memory.max" if v2 else "memory.limit_in_bytes"))
        used = _read_int(d / ("memory.current" if v2 else "memory.usage_in_bytes"))
        if limit is None or used is None or limit >= UNLIMITED:
            continue
        # page cache the cgroup can drop is not in the way of new processes
        cache = _stat(d / "memory.stat", "inactive_file" if v2 else "total_inactive_file")
        name = "memory.max" if v2 else "memory.limit_in_bytes"
        found.append(Limit(max(0, limit - used + cache), f"the cgroup's {name}, {limit / 2**30:.1f} GiB"))
    return Limit.tightest(found, NO_LIMIT)


def _meminfo(proc: Path) -> dict[str, int]:
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def _tasks(proc: Path, cgroup: Path) -> Limit:
    found = []
    running = _running_tasks(proc)
    for name in ("threads-max", "pid_max"):  # every thread takes a pid, and counts against both
        most = _read_int(proc / "sys" / "kernel" / name)
        if most is not None:
            # 2**22: the most pid_max may be on 64-bit Linux, what systemd sets on large machines
            fix = (
                f"raise the limit (sysctl -w kernel.pid_max={2**22})"
                if name == "pid_max" and most < 2**22
                else ""
            )
            found.append(Limit(most - running, f"kernel.{name} {most:,}, {running:,} in use", fix))
    for d in _cgroup_dirs(proc, cgroup, "pids"):
        most, current = _read_int(d / "pids.max"), _read_int(d / "pids.current")
        if most is not None and current is not None and most < UNLIMITED:
            found.append(Limit(most - current, f"the cgroup's pids.max {most:,}, {current:,} in use"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if os.getuid() != 0 and 0 <= soft < UNLIMITED:  # root is exempt from RLIMIT_NPROC
        mine = _tasks_of_user(proc, os.getuid())
        raise_to = "" if soft == hard else f"raise the limit (ulimit -u {'unlimited' if hard < 0 else hard})"
        found.append(Limit(soft - mine, f"ulimit -u {soft:,}, {mine:,} yours already", raise_to))
    return Limit.tightest(found, NO_LIMIT)


def _running_tasks(proc: Path) -> int:
    """Every task of the machine: /proc/loadavg's 'running/total'."""
    try:
        return int((proc / "loadavg").read_text().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return 0


def _tasks_of_user(proc: Path, uid: int) -> int:
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in (entry / "status").read_text().splitlines())
        except (OSError, ValueError):
            continue  # ended between the listing and the read
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def _open_files() -> Limit:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 0:
        return NO_LIMIT
    raise_to = "" if soft == hard else f"raise the limit (ulimit -n {'unlimited' if hard < 0 else hard})"
    return Limit(soft, f"ulimit -n {soft:,}", raise_to)
