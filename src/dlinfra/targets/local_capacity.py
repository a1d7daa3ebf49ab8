"""Whether this machine can hold a local cluster, known before anything starts.

Every local node is two processes here, its beacon (`dlinfra node run`, no TensorFlow) and its
trainer (a fork of the beacon), and each takes memory, threads and file descriptors. Nothing used to
weigh them: `--workers 1000 --ps 100` validated, and a deploy forked 1101 TensorFlow processes into
swap or the OOM killer. So the local target sizes the cluster against the machine first: one it
cannot hold is refused (exit 2) with the largest one it can, one that only time-shares the CPUs is
warned about. The machine's side (`Machine`) is read from /proc and the cgroup files
(local_machine.py) and passed in, so any machine size can be checked without that machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlinfra.errors import DlinfraError
from dlinfra.targets.local_machine import Limit, Machine

if TYPE_CHECKING:
    from dlinfra.spec.model import Spec

MIB = 2**20
GIB = 2**30
# Measured on the machine this was written on (2 CPUs, 24 GiB, TensorFlow 2.21 CPU build).
MEASURED_CPUS = 2


@dataclass(frozen=True)
class Footprint:
    """One process of a node at its peak while it trains, were it alone: each peer it talks to adds
    the `_per_peer` figures."""

    memory: int  # bytes of its own (RssAnon); the shared libraries it maps are SHARED_FILES
    threads: int  # at MEASURED_CPUS
    fds: int
    threads_per_cpu: int = 0  # the pools TensorFlow sizes by the CPUs it may run on
    memory_per_peer: int = 0
    threads_per_peer: int = 0

    def need(self, peers: int, cpus: int) -> tuple[int, int, int]:
        """(memory, threads, fds) with `peers` peers on `cpus` CPUs."""
        threads = self.threads + self.threads_per_cpu * (cpus - MEASURED_CPUS) + self.threads_per_peer * peers
        return self.memory + self.memory_per_peer * peers, max(1, threads), self.fds + FDS_PER_PEER * peers


# 2026-11-25, this machine (2 CPUs, 24 GiB), TensorFlow 2.21 CPU, the built-in digits run (600 steps),
# by bench/bench_node_footprint.py: the highest RssAnon, Threads and /proc/PID/fd count of each process,
# sampled every 0.2 s, over parameter_server runs of 1, 3 and 6 workers (1 ps) and multi_worker_mirrored
# runs of 2 and 4; the per-peer figures are what each process gained from the smaller run, the per-CPU
# ones what each process lost on 1 CPU (`--cpus 1`), plus one for the inter-op pool a node keeps at 2
# there (node/devices.py). RssAnon, not VmHWM: HWM counts TensorFlow's shared libraries again in every
# process (sum of HWM 4.2 GiB for 8 nodes, when MemAvailable fell by 1.7 GiB).
# A parameter_server worker or ps only serves: TensorFlow's gRPC server alone (node/serving.py). Its
# threads are mostly gRPC's: 64 completion queues whatever the machine (TF_GRPC_WORKER_CACHE_QUEUES).
SERVING = Footprint(memory=160 * MIB, threads=112, fds=8, threads_per_cpu=4, memory_per_peer=7 * MIB)
# The chief under parameter_server: all of TensorFlow and Keras, the model, the coordinator.
PS_CHIEF = Footprint(
    memory=370 * MIB, threads=112, fds=8, threads_per_cpu=6, memory_per_peer=3 * MIB, threads_per_peer=2
)
# Every worker under multi_worker_mirrored trains: all of TensorFlow and Keras, and the all-reduce. Worker
# 0 leads the collectives and gained from each peer (2 → 4 workers); the others, on the ring, did not.
MIRRORED_TRAINER = Footprint(
    memory=360 * MIB, threads=124, fds=13, threads_per_cpu=7, memory_per_peer=2 * MIB, threads_per_peer=2
)
BEACON = Footprint(memory=25 * MIB, threads=1, fds=5)  # per node: Python and the store, no TensorFlow
HOLDER = Footprint(memory=17 * MIB, threads=1, fds=3)  # per cluster: keeps its network namespace
# TensorFlow's libraries, mapped by every trainer and held once (the largest RssFile seen, 356 MiB).
SHARED_FILES = 360 * MIB
# A gRPC connection to each peer (the chief dials every node; a ps hears from each): 1 and 2 measured.
FDS_PER_PEER = 2

# Nodes per CPU beyond which a run is warned about: they time-share, and that is slow, not wrong.
OVERSUBSCRIBED = 4


@dataclass(frozen=True)
class Shape:
    """The nodes of a local cluster, as this check weighs them."""

    strategy: str
    workers: int
    ps: int
    workers_load_all: bool = False  # parameter_server workers with GPUs load all of TensorFlow
    # script mode (training.command): every node runs the user's program, all of TensorFlow loaded
    # on a ps too, beside the node's agent (a process of its own, the size of a beacon)
    script: bool = False

    @classmethod
    def of(cls, spec: Spec) -> Shape:
        roles = spec.roles()
        ps = roles["ps"].count if "ps" in roles else 0
        gpus = spec.cluster.workers.gpus not in (0, "auto")
        return cls(spec.strategy, roles["worker"].count, ps, gpus, spec.training.command is not None)

    @property
    def mirrored(self) -> bool:
        return self.strategy == "multi_worker_mirrored"

    @property
    def nodes(self) -> int:
        return self.workers if self.mirrored else 1 + self.workers + self.ps

    def sized(self, workers: int, ps: int) -> Shape:
        return Shape(self.strategy, workers, ps, self.workers_load_all, self.script)

    def processes(self) -> list[tuple[Footprint, int, int]]:
        """(footprint, how many, peers each talks to) for every process the cluster starts."""
        w, p = self.workers, self.ps
        common = [(BEACON, self.nodes * (2 if self.script else 1), 0), (HOLDER, 1, 0)]
        if self.mirrored:  # worker 0 leads the collectives; the rest pass tensors round a ring
            return [(MIRRORED_TRAINER, 1, w - 1), (MIRRORED_TRAINER, w - 1, min(w - 1, 2)), *common]
        worker = MIRRORED_TRAINER if self.workers_load_all or self.script else SERVING
        ps = MIRRORED_TRAINER if self.script else SERVING
        return [(PS_CHIEF, 1, w + p), (worker, w, p + 1), (ps, p, w + 1), *common]

    def counts(self) -> str:
        workers = f"{self.workers:,} worker{'s' if self.workers != 1 else ''}"
        return workers if self.mirrored else f"{workers} with {self.ps} ps"

    def flags(self, asked: Shape) -> str:
        workers = [f"--workers {self.workers}"] if self.workers != asked.workers else []
        return " ".join(workers + ([f"--ps {self.ps}"] if self.ps != asked.ps else []))


@dataclass(frozen=True)
class Demand:
    memory: int  # bytes
    tasks: int  # processes and threads
    fds: int  # of the process that holds the most

    @classmethod
    def of(cls, shape: Shape, cpus: int) -> Demand:
        needs = [(fp.need(peers, cpus), n) for fp, n, peers in shape.processes() if n]
        return cls(
            memory=SHARED_FILES + sum(memory * n for (memory, _, _), n in needs),
            tasks=sum(threads * n for (_, threads, _), n in needs),
            fds=max(fds for (_, _, fds), _ in needs),
        )


def shortfalls(shape: Shape, machine: Machine) -> list[tuple[str, Limit]]:
    """What the cluster needs beyond what the machine has, a clause and the limit each ([]: it fits)."""
    need = Demand.of(shape, machine.cpus)
    memory, tasks, files = machine.memory, machine.tasks, machine.open_files
    found = [
        (
            need.memory > memory.available,
            f"about {_gib(need.memory)} of memory, and {_gib(memory.available)} is available ({memory.what})",
            memory,
        ),
        (
            need.tasks > tasks.available,
            f"about {need.tasks:,} processes and threads (TensorFlow starts over 100 in each), and "
            f"{tasks.available:,} more may start ({tasks.what})",
            tasks,
        ),
        (
            need.fds > files.available,
            f"about {need.fds:,} open files in its busiest process (a connection to each peer), and "
            f"each may open {files.available:,} ({files.what})",
            files,
        ),
    ]
    return [(clause, limit) for over, clause, limit in found if over]


def largest_fitting(shape: Shape, machine: Machine) -> list[Shape]:
    """The most workers the machine holds with the ps asked for and, when that is more than one, with
    a single ps (fewer ps leave room for more workers); none where not even one worker fits."""
    out = []
    for ps in dict.fromkeys([shape.ps, min(shape.ps, 1)]):
        low, high = 0, shape.workers  # the need grows with every worker: bisect
        while low < high:
            mid = (low + high + 1) // 2
            if shortfalls(shape.sized(mid, ps), machine):
                high = mid - 1
            else:
                low = mid
        if low >= 1:
            out.append(shape.sized(low, ps))
    return out


def check(spec: Spec, machine: Machine) -> list[str]:
    """Refuse a local cluster this machine cannot hold (DlinfraError, exit 2); return the warnings
    for one it holds at a cost."""
    shape = Shape.of(spec)
    if short := shortfalls(shape, machine):
        raise DlinfraError(refusal(shape, machine, short))
    return warnings(shape, machine)


def refusal(shape: Shape, machine: Machine, short: list[tuple[str, Limit]]) -> str:
    fitting = sorted(largest_fitting(shape, machine), key=lambda fit: -fit.workers)
    if fitting:
        most = [("at most " if fit.workers < shape.workers else "") + fit.counts() for fit in fitting]
        holds = f"It holds {', or '.join(most)}"
        fixes = [f"fewer nodes ({', or '.join(fit.flags(shape) for fit in fitting)})"]
    else:
        holds = f"It cannot hold even {shape.sized(1, min(shape.ps, 1)).counts()}"
        fixes = []
    fixes += [limit.fix for _, limit in short if limit.fix]
    fixes.append("run on AWS, an instance per node (target: aws)")
    return (
        f"this machine cannot hold {shape.nodes:,} local nodes ({shape.counts()}): they need "
        f"{'; and '.join(clause for clause, _ in short)}. {holds}. Fix: {', or '.join(fixes)}"
    )


def warnings(shape: Shape, machine: Machine) -> list[str]:
    per_cpu = shape.nodes / machine.cpus
    if per_cpu <= OVERSUBSCRIBED:
        return []
    cpus = f"{machine.cpus} CPU{'s' if machine.cpus > 1 else ''}"
    return [
        f"{shape.nodes} local nodes on {cpus} ({per_cpu:.0f} per CPU): they take turns on them, so "
        f"expect each step roughly {per_cpu:.0f}x slower than with a CPU per node, and a slow start (each "
        "TensorFlow load costs seconds of CPU); should nodes be reported lost or stalled, raise "
        "cluster.startup_timeout, cluster.heartbeat_timeout and cluster.stall_timeout "
        "(--set cluster.startup_timeout=600)"
    ]


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB"
