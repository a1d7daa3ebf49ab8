"""`versions` in a run's manifest: what its nodes ran, never what the CLI that deployed it runs.

Until the nodes report, it is what the run's lock plans ("source": "planned"); when the run ends, the
watcher records what each node read from its own environment ("source": "nodes"): one value per
name where all nodes agree, else every node's value and `node_versions` node by node. A rerun's
nodes are compared with the original's, and a difference is recorded and shown (`version_changes`).
"""

from __future__ import annotations

from collections.abc import Mapping

from dlinfra import __version__
from dlinfra.environment.installed import versions_of
from dlinfra.errors import DlinfraError
from dlinfra.runs.manifest import EnvironmentPin, Manifest
from dlinfra.runs.run import Run

PLANNED, NODES = "planned", "nodes"
NOT_COMPARED = ("source", "dlinfra")  # how the record was made, not what ran
SHOWN_ORDER = ("tensorflow", "keras", "tf-keras", "numpy", "python", "lock", "dlinfra")


def planned(environment: Mapping[str, EnvironmentPin]) -> dict[str, str | None]:
    """What the run's locks plan (each flavor's; a name whose flavors differ shows them all)."""
    per_flavor = {
        flavor: versions_of(pin.packages, pin.platform.split()[1], pin.sha256)
        for flavor, pin in environment.items()
    }
    return {"dlinfra": __version__, "source": PLANNED, **_summary(per_flavor)}


def reported(
    manifest: Manifest, nodes: Mapping[str, dict[str, str] | None]
) -> tuple[dict[str, str | None], dict[str, dict[str, str]]]:
    """(`versions`, `node_versions`) once nodes have reported; the planned ones while none has."""
    ran = {name: v for name, v in nodes.items() if v}
    if not ran:
        return manifest.versions, {}
    summary = _summary(ran)
    differ = any(" / " in (value or "") for value in summary.values())
    return {"dlinfra": manifest.versions.get("dlinfra"), "source": NODES, **summary}, (ran if differ else {})


def changes(original: Mapping[str, str | None], rerun: Mapping[str, str | None]) -> list[str]:
    """What the rerun's nodes ran differently from the original's: "tensorflow 2.15.1 → 2.16.0"."""
    if original.get("source") != NODES or rerun.get("source") != NODES:
        return []  # a side never reported (an older record, a run that failed before its nodes ran)
    names = sorted((set(original) | set(rerun)) - set(NOT_COMPARED))
    return [
        f"{name} {original.get(name) or '-'} → {rerun.get(name) or '-'}"
        for name in names
        if original.get(name) != rerun.get(name)
    ]


def rerun_changes(run: Run, ran: Mapping[str, str | None]) -> list[str] | None:
    """A rerun's `version_changes` (None: the run is no rerun, or its original is not on this machine)."""
    original = run.manifest().rerun_of
    if original is None:
        return None
    try:
        before = Run.open(original).manifest().versions
    except DlinfraError:
        return None
    return changes(before, ran)


def shown(versions: Mapping[str, str | None]) -> str:
    """One line for `dlinfra show`: "tensorflow 2.15.1, keras 2.15.0, ... (ran on the nodes)"."""
    source = versions.get("source")
    names = sorted((n for n in versions if n != "source"), key=lambda n: (*SHOWN_ORDER, n).index(n))
    items = ", ".join(f"{n} {v[:12] if n == 'lock' else v}" for n in names if (v := versions[n]))
    if source == NODES:
        return f"{items} (what the nodes ran)"
    if source == PLANNED:
        return f"{items} (planned by the lock: no node has reported yet)"
    return f"{items} (recorded by an older dlinfra: the deploying machine's, not the nodes')"


def _summary(each: Mapping[str, Mapping[str, str]]) -> dict[str, str | None]:
    names = sorted({name for versions in each.values() for name in versions})
    out: dict[str, str | None] = {}
    for name in names:
        values = sorted({versions.get(name) or "-" for versions in each.values()})
        out[name] = " / ".join(values)
    return out
