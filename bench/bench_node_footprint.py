"""What one local node costs this machine: memory, threads and open file descriptors of each process
of a real `dlinfra deploy`, sampled from /proc/PID/status and /proc/PID/fd while it trains, per role:
a serving node (a parameter_server worker or ps: TensorFlow's gRPC server alone), a trainer (the
chief under parameter_server, every worker under multi_worker_mirrored), a node's beacon, and the
cluster's network-namespace holder. These are the figures dlinfra.targets.local_capacity budgets a
cluster with; the tables set the two side by side.

Memory is read three ways: VmHWM (the peak of all resident pages), RssAnon (the process's own pages)
and RssFile (mapped files: TensorFlow's shared libraries, one copy in the page cache however many
processes map them). The budget is RssAnon per process plus the largest RssFile once; the last lines
check that against how far MemAvailable actually fell while the cluster ran.

Two sizes of each strategy tell what each extra peer adds (the parameter_server chief talks to every
node, a ps hears from every worker and the chief, mirrored worker 0 leads the collectives); `--cpus 1`
runs everything on one CPU, for what each CPU adds. About 4 minutes on 2 CPUs.

    python bench/bench_node_footprint.py [--steps 600] [--cpus N] [--only parameter_server:3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_cpu_split import tree_cpu  # the same /proc walk: pid → (CPU seconds, command line)

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from dlinfra.targets import local_capacity as capacity  # noqa: E402

MIB = 2**20
RUNS = (
    "parameter_server:1",
    "parameter_server:3",
    "parameter_server:6",
    "multi_worker_mirrored:2",
    "multi_worker_mirrored:4",
)
SAMPLE_SECONDS = 0.2


@dataclass
class Peak:
    """One process's highest readings over the run."""

    kind: str  # beacon | trainer | holder | cli
    node: str
    rss: int = 0
    hwm: int = 0
    anon: int = 0
    file: int = 0
    threads: int = 0
    fds: int = 0
    samples: int = 0

    def read(self, pid: int) -> None:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)

        def kib(name: str) -> int:
            return int(fields.get(name, "0 kB").split()[0]) * 1024

        self.rss = max(self.rss, kib("VmRSS"))
        self.hwm = max(self.hwm, kib("VmHWM"))
        self.anon = max(self.anon, kib("RssAnon"))
        self.file = max(self.file, kib("RssFile"))
        self.threads = max(self.threads, int(fields["Threads"]))
        self.fds = max(self.fds, len(os.listdir(f"/proc/{pid}/fd")))
        self.samples += 1


@dataclass
class Run:
    strategy: str
    workers: int
    seconds: float = 0.0
    status: str = ""
    available_before: int = 0
    available_low: int = 0
    peaks: dict[int, Peak] = field(default_factory=dict)

    def nodes(self) -> list[Peak]:
        return [p for p in self.peaks.values() if p.kind in ("beacon", "trainer", "holder")]


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _tree(root: int) -> dict[int, str]:
    """pid → command line of `root` and every process under it."""
    return {pid: cmd for pid, (_, cmd) in tree_cpu(root).items()}


def _classify(pid: int, root: int, cmd: str) -> tuple[str, str] | None:
    node = re.search(r"/nodes/([a-z]+-\d+)\.json", cmd)
    if "dlinfra node run" in cmd and node:
        return "beacon", node.group(1)
    if "dlinfra node train" in cmd and node:
        return "trainer", node.group(1)
    if "private_network" in cmd:
        return "holder", "-"
    if pid == root:
        return "cli", "-"
    return None  # an nsenter or unshare passing through


def measure(strategy: str, workers: int, steps: int, cpus: int | None) -> Run:
    run = Run(strategy, workers, available_before=mem_available())
    run.available_low = run.available_before
    pin = ["taskset", "-c", ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:cpus])] if cpus else []
    with tempfile.TemporaryDirectory() as home:
        args = ["deploy", "--workers", str(workers), "--steps", str(steps), "--set", f"strategy={strategy}"]
        started = time.monotonic()
        proc = subprocess.Popen(
            [*pin, sys.executable, "-m", "dlinfra", "--color", "never", *args],
            env=dict(os.environ, DLINFRA_HOME=home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        while proc.poll() is None:
            run.available_low = min(run.available_low, mem_available())
            for pid, cmd in _tree(proc.pid).items():
                if (what := _classify(pid, proc.pid, cmd)) is None:
                    continue
                peak = run.peaks.setdefault(pid, Peak(*what))
                peak.kind, peak.node = what  # a trainer is its beacon's fork until it execs
                with contextlib.suppress(OSError, KeyError):  # it ended between the listing and the read
                    peak.read(pid)
            time.sleep(SAMPLE_SECONDS)
        output = proc.communicate()[0]
        run.seconds = time.monotonic() - started
        run.status = next((line for line in output.splitlines() if line.startswith("run ")), "no result")
        if proc.returncode != 0:
            print(output[-3000:], file=sys.stderr)
    return run


def role_of(run: Run, peak: Peak) -> str:
    if peak.kind != "trainer":
        return peak.kind
    if run.strategy == "multi_worker_mirrored":
        return "trainer (mirrored)"
    return "trainer (ps chief)" if peak.node.startswith("chief") else "serving"


def _print_run(run: Run) -> None:
    print(f"\n{run.strategy} --workers {run.workers}: {run.status[:60]} ({run.seconds:.0f} s)")
    print(
        f"  {'process':8} {'node':9} {'role':19} {'RSS':>5} {'HWM':>5} {'anon':>5} {'file':>5} "
        f"{'thr':>4} {'fds':>4}  (MiB; the highest of every sample)"
    )
    for pid, p in sorted(run.peaks.items(), key=lambda item: (item[1].node, item[1].kind)):
        print(
            f"  {p.kind:8} {p.node:9} {role_of(run, p):19} {p.rss / MIB:5.0f} {p.hwm / MIB:5.0f} "
            f"{p.anon / MIB:5.0f} {p.file / MIB:5.0f} {p.threads:4} {p.fds:4}  pid {pid}, {p.samples} samples"
        )
    nodes = run.nodes()
    model = sum(p.anon for p in nodes) + max(p.file for p in nodes)
    print(
        f"  MemAvailable fell by {(run.available_before - run.available_low) / MIB:.0f} MiB; "
        f"anon of every process + the largest file share: {model / MIB:.0f} MiB; "
        f"sum of HWM: {sum(p.hwm for p in nodes) / MIB:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--cpus", type=int, help="run every process on this many CPUs (taskset)")
    parser.add_argument("--only", action="append", help="STRATEGY:WORKERS (repeatable)")
    args = parser.parse_args()
    cpus = args.cpus or len(os.sched_getaffinity(0))
    print(f"{cpus} CPUs; {time.strftime('%Y-%m-%d')}; {args.steps} steps per run")
    runs = []
    for item in args.only or RUNS:
        strategy, _, workers = item.partition(":")
        runs.append(run := measure(strategy, int(workers), args.steps, args.cpus))
        _print_run(run)
    print(f"\nper role, the highest of every run, and the module's figures at {cpus} CPUs:")
    print(
        f"  {'role':19} {'HWM':>5} {'anon':>5} {'file':>5} {'thr':>4} {'fds':>4}   module: anon, threads, fds"
    )
    budget = {
        "serving": capacity.SERVING,
        "trainer (ps chief)": capacity.PS_CHIEF,
        "trainer (mirrored)": capacity.MIRRORED_TRAINER,
        "beacon": capacity.BEACON,
        "holder": capacity.HOLDER,
    }
    for role, figures in budget.items():
        seen = [p for run in runs for p in run.peaks.values() if role_of(run, p) == role]
        if not seen:
            continue
        hwm, anon, file, threads, fds = (
            max(getattr(p, a) for p in seen) for a in ("hwm", "anon", "file", "threads", "fds")
        )
        print(
            f"  {role:19} {hwm / MIB:5.0f} {anon / MIB:5.0f} {file / MIB:5.0f} {threads:4} {fds:4}   "
            f"{figures.memory / MIB:.0f}, {figures.need(0, cpus)[1]}, {figures.fds}; per peer "
            f"{figures.memory_per_peer / MIB:.0f}, {figures.threads_per_peer}, {capacity.FDS_PER_PEER}"
        )
    print(f"  shared files, once per cluster: module {capacity.SHARED_FILES / MIB:.0f} MiB")
    for strategy in dict.fromkeys(r.strategy for r in runs):
        sizes = sorted((r for r in runs if r.strategy == strategy), key=lambda r: r.workers)
        if len(sizes) < 2 or sizes[-1].workers == sizes[0].workers:
            continue
        small, big = sizes[0], sizes[-1]
        added = big.workers - small.workers
        print(f"\nwhat each extra peer adds ({strategy}, --workers {small.workers} → {big.workers}):")
        for node in ("chief-0", "ps-0", "worker-0", "worker-1"):
            a, b = (
                next((p for p in r.peaks.values() if (p.kind, p.node) == ("trainer", node)), None)
                for r in (small, big)
            )
            if a is None or b is None:
                continue
            print(
                f"  {node}: fds {(b.fds - a.fds) / added:+.1f}, "
                f"threads {(b.threads - a.threads) / added:+.1f}, "
                f"anon {(b.anon - a.anon) / added / MIB:+.1f} MiB per peer"
            )
    print(f"  module: {capacity.FDS_PER_PEER} fds per peer")


if __name__ == "__main__":
    main()
