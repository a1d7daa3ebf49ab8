"""Preflight records and their judgement: what each node measured before the first step, and which
nodes fall short of their peers or of their instance type's history.

A node's figures are judged against the median of its role's peers (the same hardware, doing the
same work at the same moment), so one slow node stands out whatever the machine's load. A uniformly
slow cluster has no odd one out: the type's history in the results bucket catches that (`history`).
Input and latency figures are shown, not judged: on a shared store or loopback they move with load,
and a flag that fires on noise teaches people to ignore flags.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Literal

from pydantic import Field

from dlinfra.runs.records import Record
from dlinfra.spec.catalog import catalog

# Figures where more is better, judged against peers; name → (label, unit)
JUDGED = {
    "gemm_gflops": ("gemm", "GFLOP/s"),
    "conv_gflops": ("conv", "GFLOP/s"),
    "h2d_gb_s": ("host→GPU", "GB/s"),
    "link_mb_s": ("links", "MB/s"),
    # one figure per run (every worker times the same collective): the type's history judges it
    "allreduce_gb_s": ("all-reduce", "GB/s bus"),
}
SHOWN = {
    "link_of_baseline": ("links/baseline", "x"),  # the catalog's baseline bandwidth is the ceiling
    "allreduce_of_baseline": ("all-reduce/baseline", "x"),
    "allreduce_mb": ("reduced", "MB"),  # the model's gradient, or measure.DEFAULT_GRADIENT_BYTES
    "input_mb_s": ("input", "MB/s"),
    "latency_ms": ("latency", "ms"),
}
Action = Literal["train", "replace", "fail", "warn"]


class Link(Record):
    """One measured transfer from the node that measured it to `peer`."""

    peer: str
    send_mb_s: float
    receive_mb_s: float
    latency_ms: float

    @property
    def mb_s(self) -> float:
        return min(self.send_mb_s, self.receive_mb_s)


class NodeFigures(Record):
    """preflight/<round>/<node>.json: first a node's readiness (its link sink), then what it measured."""

    node: str
    role: str
    flavor: str  # cpu | gpu: nodes of one flavor run one build of everything, so versions must agree
    instance_type: str | None = None
    machine: str  # its kernel's boot id: nodes on one machine measure in turn, their links are not judged
    sink: str  # host:port its link sink listens on
    measured: bool = False  # its own checks are in: the next node on its machine may measure
    done: bool = False  # every check is in, the all-reduce with every worker too (mirrored)
    figures: dict[str, float] = Field(default_factory=dict)
    links: list[Link] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)
    cpu_quota: float | None = None  # the CPUs its cgroup lets it use, where one limits it
    seconds: float | None = None  # how long its checks took


class Flag(Record):
    node: str
    figure: str  # a JUDGED key, or "version <name>"
    value: float | str
    reference: float | str  # the peers' median or the type's baseline; the peers' version
    against: Literal["peers", "history", "versions"]
    ratio: float | None = None

    def says(self) -> str:
        if self.against == "versions":
            return (
                f"{self.node}: {self.figure.removeprefix('version ')} {self.value} (peers: {self.reference})"
            )
        label, unit = JUDGED[self.figure]
        whose = "its role's median" if self.against == "peers" else "its type's baseline"
        assert isinstance(self.value, float) and isinstance(self.reference, float)
        return (
            f"{self.node}: {label} {number(self.value)} {unit}, {self.ratio:.2f} of {whose} "
            f"({number(self.reference)} {unit})"
        )


class Verdict(Record):
    """preflight/<round>/verdict.json, written by the chief once every node measured."""

    round: int
    action: Action
    flagged: list[Flag] = Field(default_factory=list)
    min_ratio: float
    checks: str
    seconds: float  # from the round's first ready record to the verdict

    @property
    def flagged_nodes(self) -> list[str]:
        return sorted({f.node for f in self.flagged})

    def says(self) -> str:
        if not self.flagged:
            took = f"{self.checks}, {self.seconds:.0f}s"
            return f"preflight passed ({took}): no node below {self.min_ratio} of its peers' median"
        return "preflight flagged " + "; ".join(f.says() for f in self.flagged)


def figures(records: list[NodeFigures]) -> dict[str, dict[str, float]]:
    """node → figure → value. A link counts for both its ends, and only between two machines: between
    processes of one machine it measures that machine's memory and scheduler, not a network."""
    host = {r.node: r.machine for r in records}
    links: dict[str, list[Link]] = {r.node: [] for r in records}
    for r in records:
        for link in r.links:
            if link.peer in host and host[link.peer] != host[r.node]:
                links[r.node].append(link)
                links[link.peer].append(link)
    out = {}
    types = catalog()
    for r in records:
        mine = out[r.node] = dict(r.figures)
        if links[r.node]:
            mine["link_mb_s"] = statistics.median(link.mb_s for link in links[r.node])
            mine["latency_ms"] = statistics.median(link.latency_ms for link in links[r.node])
        known = types.get(r.instance_type or "")
        if known and known.network_baseline_gbps:
            for name, gbps in (
                ("link", mine.get("link_mb_s", 0) * 8 / 1000),
                ("allreduce", mine.get("allreduce_gb_s", 0) * 8),
            ):
                if gbps:
                    mine[f"{name}_of_baseline"] = round(gbps / known.network_baseline_gbps, 3)
    return out


def judge(
    records: list[NodeFigures], min_ratio: float, history: dict[str, dict[str, float]] | None = None
) -> list[Flag]:
    """Every figure of a node below `min_ratio` of its role's median (roles with two nodes or more),
    or of its type's baseline (`history`: instance type → figure → baseline); every version that
    differs from its flavor's majority (ties: the first node's, in cluster order)."""
    measured = figures(records)
    flags: list[Flag | None] = []
    roles: dict[str, list[str]] = {}
    for record in records:
        roles.setdefault(record.role, []).append(record.node)
    for peers in roles.values():
        for name in JUDGED:
            values = {node: v for node in peers if (v := measured[node].get(name)) is not None}
            median = statistics.median(values.values()) if len(values) >= 2 else 0.0
            flags += [_below(node, name, v, median, "peers", min_ratio) for node, v in values.items()]
    for record in records:
        for name, reference in (history or {}).get(record.instance_type or "", {}).items():
            if (v := measured[record.node].get(name)) is not None:
                flags.append(_below(record.node, name, v, reference, "history", min_ratio))
    return [flag for flag in flags if flag is not None] + drift(records)


def _below(
    node: str, name: str, value: float, reference: float, against: Literal["peers", "history"], least: float
) -> Flag | None:
    if reference <= 0 or value / reference >= least:
        return None
    return Flag(
        node=node, figure=name, value=value, reference=reference, against=against, ratio=value / reference
    )


def drift(records: list[NodeFigures]) -> list[Flag]:
    flags = []
    flavors: dict[str, list[NodeFigures]] = {}
    for record in records:
        flavors.setdefault(record.flavor, []).append(record)
    for group in flavors.values():
        for key in sorted({k for r in group for k in r.versions}):
            seen = [r.versions.get(key, "absent") for r in group]
            counts = Counter(seen)
            top = max(counts.values())
            usual = next(v for v in seen if counts[v] == top)  # first in cluster order among the most common
            flags += [
                Flag(node=r.node, figure=f"version {key}", value=v, reference=usual, against="versions")
                for r, v in zip(group, seen, strict=True)
                if v != usual
            ]
    return flags


def action(flags: list[Flag], on_fail: str, replaced: set[str]) -> Action:
    """What the run does with this round's flags; a node flagged again after its replacement fails it."""
    if not flags:
        return "train"
    if on_fail == "warn":
        return "warn"
    if on_fail == "replace" and not ({f.node for f in flags} & replaced):
        return "replace"
    return "fail"


def baselines(records: list[NodeFigures]) -> dict[str, dict[str, float]]:
    """This cluster's median per instance type and judged figure: what a type's history keeps."""
    measured = figures(records)
    types: dict[str, list[str]] = {}
    for record in records:
        if record.instance_type:
            types.setdefault(record.instance_type, []).append(record.node)
    out: dict[str, dict[str, float]] = {}
    for kind, group in types.items():
        for name in JUDGED:
            values = [v for node in group if (v := measured[node].get(name)) is not None]
            if values:
                out.setdefault(kind, {})[name] = statistics.median(values)
    return out


def table(records: list[NodeFigures], verdict: Verdict | None) -> list[list[str]]:
    """Rows for the preflight table: node, each figure, and what was flagged (header first)."""
    measured = figures(records)
    shown = [n for n in [*JUDGED, *SHOWN] if any(n in values for values in measured.values())]
    labels = {**JUDGED, **SHOWN}
    header = ["node", *(f"{labels[n][0]} {labels[n][1]}" for n in shown), "quota", "flag"]
    flagged: dict[str, list[str]] = {}
    for flag in verdict.flagged if verdict else []:
        flagged.setdefault(flag.node, []).append(
            flag.figure.removeprefix("version ") if flag.against == "versions" else labels[flag.figure][0]
        )
    rows = [header]
    for r in records:
        cells = [r.node]
        for n in shown:
            v = measured[r.node].get(n)
            cells.append("-" if v is None else number(v))
        cells.append("-" if r.cpu_quota is None else f"{r.cpu_quota:.2g} CPU")
        cells.append(", ".join(flagged.get(r.node, [])) or "ok")
        rows.append(cells)
    return rows


def number(value: float) -> str:
    """Three significant digits, without an exponent: 0.482, 48.2, 1490."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
