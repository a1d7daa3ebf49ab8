"""The throughput model: what a cluster's links and devices allow, and which of them binds.

Parameter servers (async): every worker step reads the variables from the ps tier and sends the
gradient back, one after the other, and computes in between. With the variables sharded evenly each
ps sends and receives 1/P of them per global step; EC2 NICs are full duplex, so the ps tier allows
`P x bandwidth / model bytes` steps/s, of which many workers reach about PS_TIER_EFFICIENCY
(measured: 70-80 %; not the oft-quoted `/ (2 x model bytes)`, which serialises push and pull on one
budget and holds for one worker only).

multi_worker_mirrored (sync): each step computes, then a ring all-reduce moves `2(N-1)/N` gradients
through every worker's NIC; the step waits for both.

One TCP flow (TensorFlow's gRPC channel between two tasks) is capped below the NIC on EC2 outside a
cluster placement group; local nodes share one machine's cores, so their compute adds up there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Bound = Literal["compute", "this machine's cores", "worker NIC", "ps NIC", "TCP flow", "all-reduce"]

PS_TIER_EFFICIENCY = 0.8  # the share of the ps tier's full-duplex bound many workers reach
# Where the workers' bound and the ps tier's meet, both queues fill and neither is reached: the two
# are blended as (a^-k + b^-k)^(-1/k) rather than min'd. Measured on shaped links here (BENCHMARKS.md,
# "Sizing"): the plain minimum overshot by up to 35 % near the knee; k = 3 puts every point within
# 21 %, and the notes' independent 1 Gb/s runs (7.8, 8.8, 11.7 steps/s at 1, 2, 4 workers) within 19 %.
BLEND = 3.0
ALLREDUCE_EFFICIENCY = 0.85  # a ring at its links' speed, less gRPC's framing (measured: 0.83)


@dataclass(frozen=True)
class Links:
    worker: float  # bytes/s each way, one worker's NIC
    ps: float  # bytes/s each way, one parameter server's NIC
    flow: float | None  # bytes/s of one TCP flow (None: no cap below the NIC)

    def per_flow(self, nic: float) -> float:
        return min(nic, self.flow) if self.flow else nic


@dataclass(frozen=True)
class Workload:
    strategy: str
    parameter_bytes: int
    gradient_bytes: int
    examples_per_step: int  # one worker's step: its batch on every replica it has
    compute_s: float | None  # one worker's forward and backward pass (None: not known)
    shared_machine: bool  # every node on this one machine (local): their compute shares its cores
    variables: tuple[int, ...] = ()  # each variable's size, in the order they are made

    def busiest_share(self, ps: int) -> float:
        """The share of the bytes on the busiest ps. Without a partitioner TensorFlow places each
        variable whole on the next ps in turn; where the turn starts depends on what was made
        before the model (the run's own counters), so the worst start is taken."""
        total = sum(self.variables)
        if not total or ps < 2:
            return 1 / ps
        worst = 0
        for start in range(ps):
            load = [0] * ps
            for i, size in enumerate(self.variables):
                load[(start + i) % ps] += size
            worst = max(worst, max(load))
        return worst / total


@dataclass(frozen=True)
class Point:
    workers: int
    ps: int
    steps_per_s: float  # global steps (mirrored: one per all-reduce; parameter servers: every worker's)
    examples_per_s: float
    bound: Bound
    usd_per_hour: float | None = None

    @property
    def usd_per_1000_steps(self) -> float | None:
        if self.usd_per_hour is None or self.steps_per_s <= 0:
            return None
        return self.usd_per_hour / 3600 / self.steps_per_s * 1000


def predict(work: Workload, links: Links, workers: int, ps: int) -> Point:
    """The predicted throughput; with compute unknown, what the links alone allow (an upper bound)."""
    if work.strategy == "multi_worker_mirrored":
        return _mirrored(work, links, workers)
    return _parameter_servers(work, links, workers, ps)


def _parameter_servers(work: Workload, links: Links, workers: int, ps: int) -> Point:
    compute = work.compute_s or 0.0
    busiest = work.busiest_share(ps)
    # a worker reads every shard at once: as fast as its NIC, or the busiest ps's flow, allows
    moved = work.parameter_bytes + work.gradient_bytes
    own, served = moved / links.worker, busiest * moved / links.per_flow(links.ps)
    talk = max(own, served)
    each = workers / (compute + talk)
    tier = PS_TIER_EFFICIENCY * links.ps / (busiest * max(work.parameter_bytes, work.gradient_bytes))
    steps = (each**-BLEND + tier**-BLEND) ** (-1 / BLEND)
    bound: Bound = "compute" if compute >= talk else "worker NIC"
    if talk > compute and served > own:  # the busiest ps's side of the transfer is the slow one
        bound = "TCP flow" if links.flow and links.flow < links.ps else "ps NIC"
    if tier < each:
        bound = "ps NIC"
    if work.shared_machine and work.compute_s and 1 / work.compute_s < steps:
        steps, bound = 1 / work.compute_s, "this machine's cores"
    return Point(workers, ps, steps, steps * work.examples_per_step, bound)


def _mirrored(work: Workload, links: Links, workers: int) -> Point:
    compute = (work.compute_s or 0.0) * (workers if work.shared_machine else 1)
    ring = 2 * (workers - 1) / workers * work.gradient_bytes
    reduce = ring / (ALLREDUCE_EFFICIENCY * links.per_flow(links.worker))
    step = compute + reduce
    steps = 1 / step if step > 0 else float("inf")
    if compute < reduce:
        bound: Bound = "all-reduce"
    else:
        bound = "this machine's cores" if work.shared_machine and workers > 1 else "compute"
    return Point(workers, 0, steps, steps * workers * work.examples_per_step, bound)
