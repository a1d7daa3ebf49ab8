"""What the chaos soak (bench_chaos.py) does to one run, drawn from its seed: the run's shape (target,
strategy, mode) and its faults, each at a share of the run's steps, on a node. Kept apart from the
driver so a seed's plan can be printed, and replayed, without running anything."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# What each fault is, as injected (bench_chaos.Injector):
#   kill9          SIGKILL of the node's trainer (its process group)
#   freeze         SIGSTOP of the trainer, SIGCONT after `seconds` (shorter than the heartbeat timeout)
#   kill_in_save   SIGKILL of the trainer as its next checkpoint appears in its work dir
#   kill_in_restore  SIGKILL, then SIGKILL of the new life as soon as it is up (restoring)
#   spot           an EC2 interruption notice for the node (loopback metadata stand-in)
#   store_outage   the S3 endpoint down for `seconds` (the moto server stopped, then back on its port)
#   netcut         the node's link down for `seconds` (shaped local network: a netns per node)
#   terminate      the node's instance terminated through the EC2 API (aws-emulated)
#   heal_cut       terminate, then terminate the replacement the heal launched
KINDS = ("kill9", "freeze", "kill_in_save", "kill_in_restore", "spot", "store_outage", "netcut", "terminate",
         "heal_cut")  # fmt: skip
NODELESS = {"store_outage"}


@dataclass
class Fault:
    kind: str
    node: str | None
    at: float  # share of the run's steps reached when it is injected
    seconds: float = 0.0  # how long a freeze, an outage or a cut lasts
    together: bool = False  # injected with the fault before it (two faults at once)
    # what happened, filled as the run goes
    injected_at: float | None = None
    step: int | None = None
    note: str = ""

    def label(self) -> str:
        where = f" {self.node}" if self.node else ""
        span = f" {self.seconds:.0f}s" if self.seconds else ""
        return f"{self.kind}{where}{span} at {self.at:.0%}" + (
            " (with the one before)" if self.together else ""
        )


@dataclass
class Cell:
    target: str  # local | aws-emulated
    strategy: str  # ps | mwms
    mode: str  # program | script

    def __str__(self) -> str:
        return f"{self.target}/{self.strategy}/{self.mode}"


@dataclass
class RunPlan:
    seed: int
    cell: Cell
    faults: list[Fault] = field(default_factory=list)

    @property
    def network(self) -> str:
        """A spot notice needs the host's loopback (the stand-in); a link cut, a namespace per node."""
        kinds = {f.kind for f in self.faults}
        return "host" if "spot" in kinds else "shaped" if "netcut" in kinds else "auto"

    def nodes(self) -> list[str]:
        nodes = ["worker-0", "worker-1"]
        if self.cell.strategy == "ps":
            nodes += ["chief-0", "ps-0"]
        return nodes


def kinds_for(cell: Cell) -> list[str]:
    kinds = ["kill9", "kill9", "freeze", "kill_in_restore", "store_outage"]
    if cell.mode == "program" or cell.strategy == "mwms":
        kinds.append("kill_in_save")  # the ps guide's script writes no checkpoint
    if cell.target == "local":
        kinds += ["spot", "netcut"]
    else:
        kinds += ["terminate", "heal_cut"]
    return kinds


def plan_run(seed: int, cell: Cell, faults: int) -> RunPlan:
    """`faults` faults; a run that cuts a link has no spot notice and no store outage (its nodes
    cannot reach the stand-in or moto on the host's loopback)."""
    rng = random.Random(seed)
    plan = RunPlan(seed, cell)
    kinds = kinds_for(cell)
    while len(plan.faults) < faults:
        kind = rng.choice(kinds)
        drawn = {kind, *(f.kind for f in plan.faults)}
        if drawn >= {"spot", "netcut"} or drawn >= {"store_outage", "netcut"}:
            continue  # a link cut puts the nodes in namespaces of their own, off the host's loopback
        if kind == "kill_in_save" and cell.strategy == "ps" and cell.mode == "program":
            node = "chief-0"  # under parameter servers the chief saves
        elif kind == "kill_in_save":
            node = "worker-0"  # the mirrored owner saves what the store keeps
        elif kind == "spot":
            node = rng.choice([n for n in plan.nodes() if n.startswith("worker")])  # spot: workers only
        else:
            node = None if kind in NODELESS else rng.choice(plan.nodes())
        seconds = {"freeze": rng.uniform(2, 8), "store_outage": rng.uniform(3, 12),
                   "netcut": rng.uniform(2, 8)}.get(kind, 0.0)  # fmt: skip
        together = bool(plan.faults) and rng.random() < 0.25 and node != plan.faults[-1].node
        at = plan.faults[-1].at if together else rng.uniform(0.1, 0.8)
        plan.faults.append(Fault(kind, node, at, seconds, together))
    plan.faults.sort(key=lambda f: f.at)
    return plan
