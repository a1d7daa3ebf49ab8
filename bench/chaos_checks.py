"""The chaos soak's invariants, checked by code after every run (bench_chaos.py): what a run that met
its faults must have ended with. Each check returns the ways the run broke it ([] when it held)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from chaos_plan import Fault, RunPlan

from dlinfra.runs.layout import CHECKPOINTS, MODEL, RunStore
from dlinfra.runs.records import Incident, Marker, Metrics, Restart
from support import fresh_process_accuracy

ACCURACY_TOLERANCE = 0.05  # a DONE model against the same seed's fault-free run, on the held-out split
PER_CALL = 20  # a remote call re-run after a node leaves may count once more (log_every bounds a call)
SPOT_LOOK = 2 * 2.0 + 1  # two of the beacon's metadata polls (node.spot.POLL_SECONDS), and a second
PAUSE_LOOK = 1.0  # how often a beacon looks at its trainer's process state (node.beacon.NEWS_POLL)
TORN = (".pulling", ".tmp", "_temp")  # a name a half-written upload or pull would leave


def outcome(
    plan: RunPlan, marker: Marker | None, metrics: Metrics | None, wall: float, bound: float
) -> list[str]:
    """DONE, or an end whose verdict names a node and a cause, within the bound."""
    broken = []
    if wall > bound:
        broken.append(f"ended after {wall:.0f} s, past its bound of {bound:.0f} s")
    if marker is None:
        return [*broken, "no marker: the run never ended"]
    if marker.marker == "DONE":
        return broken
    if not marker.node or not (marker.verdict or marker.error or marker.reason):
        broken.append(f"{marker.marker} with no node or no cause: {marker.model_dump(exclude_none=True)}")
    hit = {f.node for f in plan.faults if f.node}
    if marker.node and marker.node not in hit and not _blames_after(marker):
        broken.append(f"{marker.marker} blames {marker.node}, which met no fault ({sorted(hit)} did)")
    return broken


def _blames_after(marker: Marker) -> bool:
    """A node blamed 'after' another's restart names the faulted node in its message."""
    return "after " in (marker.error or "") and bool(marker.restarts)


def steps(plan: RunPlan, metrics: Metrics | None, pointer_step: int | None, total: int | None) -> list[str]:
    """Program mode: exactly the scheduled steps under MWMS; under parameter servers every update
    counted once, give or take the one remote call a leaving node may have finished unreported. The
    MWMS guide in script mode: its last reported step exactly its epochs' steps (it resumes from its
    own checkpoint of the last whole epoch: none skipped, none counted twice)."""
    if metrics is None or total is None:
        return []
    done = metrics.steps or 0
    if plan.cell.mode == "script":
        return [] if done == total else [f"the script reported step {done} last, its epochs make {total}"]
    broken = []
    slack = PER_CALL if plan.cell.strategy == "ps" else 0
    if not total <= done <= total + slack:
        broken.append(f"steps {done}, scheduled {total}" + (f" (+{slack} allowed)" if slack else ""))
    # the final model is the last step's, whatever count that is (under parameter servers the
    # coordinator reruns a lost call whose updates may have landed: seed 300 ended at 1210 of 1200)
    if pointer_step is not None and pointer_step != done:
        broken.append(f"the last checkpoint is at step {pointer_step}, not the last step {done}")
    return broken


def store_consistent(store: RunStore) -> tuple[list[str], int | None]:
    """Every checkpoint in the store whole (its index with its data), the pointer naming files that
    are there, no torn upload left; and the pointer's step."""
    keys = store.store.list_keys(CHECKPOINTS + "/")
    names = {k.rsplit("/", 1)[-1] for k in keys}
    broken = [f"torn file in the store: {k}" for k in keys if any(t in k.rsplit("/", 1)[-1] for t in TORN)]
    prefixes = {m.group(1) for n in names if (m := re.match(r"(ckpt-\d+)\.", n))}
    for prefix in sorted(prefixes):
        parts = {n for n in names if n.startswith(prefix + ".")}
        if f"{prefix}.index" not in parts or not any(".data-" in n for n in parts):
            broken.append(f"checkpoint {prefix} incomplete in the store: {sorted(parts)}")
    pointer = store.latest_checkpoint()
    if pointer is not None:
        missing = [f for f in pointer.files if f not in names]
        if missing:
            broken.append(f"the pointer names {pointer.prefix}, whose {missing} are not in the store")
    return broken, pointer.step if pointer else None


def faults_named(
    plan: RunPlan,
    marker: Marker | None,
    metrics: Metrics | None,
    lived: list[Incident],
    beat: float,
    shown: list[Restart],
) -> list[str]:
    """Every fault the run met is in its record: a kill or a terminated instance as a restart of that
    node, a spot notice as an interruption, a freeze as a pause of that node (or its restart, had it
    been killed meanwhile), a store outage as the store unreachable from some node. A freeze or an
    outage shorter than two beats may fall between the beacon's looks or writes: not required.
    `shown`: the restarts the result shows (the nodes' own records, newer than the metrics' copy: a
    kill after the owner wrote its metrics is in them, seed 707)."""
    if marker is None or marker.marker != "DONE" or metrics is None:
        return []
    every = [*metrics.restarts, *shown]
    restarted = {r.node for r in every}
    interrupted = {n.node for n in metrics.interruptions}
    broken = []
    for fault in plan.faults:
        if fault.injected_at is None:
            continue
        if fault.kind in ("kill9", "kill_in_save", "kill_in_restore") and fault.node not in restarted:
            broken.append(f"{fault.label()}: no restart of {fault.node} in the result")
        if fault.kind == "spot" and fault.note != "never seen by its node" and fault.node not in interrupted:
            broken.append(f"{fault.label()}: no interruption of {fault.node} in the result")
        unseen = fault.note == "never seen by its node"
        if fault.kind == "spot" and unseen and not _ended_soon(fault, every):
            broken.append(f"{fault.label()}: never seen by {fault.node}, whose life went on")
        paused = fault.node in restarted or any(
            i.kind == "paused" and i.node == fault.node and _during(i, fault) for i in lived
        )
        if fault.kind == "freeze" and fault.seconds >= 2 * PAUSE_LOOK and not paused:
            broken.append(f"{fault.label()}: no pause of {fault.node} in the result")
        seen = any(i.kind == "store unreachable" and _during(i, fault) for i in lived)
        if fault.kind == "store_outage" and fault.seconds >= 2 * beat and not seen:
            broken.append(f"{fault.label()}: no node saw the store unreachable, says the result")
    return broken


def _ended_soon(fault: Fault, restarts: list[Restart]) -> bool:
    """The noticed life ended before its beacon's next look at the metadata (a kill, a restart with
    its cluster): the next life is a new session, which the stand-in answers as a new instance."""
    began = fault.injected_at or 0.0
    return any(r.node == fault.node and began <= r.failed_at <= began + SPOT_LOOK for r in restarts)


def _during(incident: Incident, fault: Fault) -> bool:
    """The incident and the fault's span overlap (a few seconds' slack for the looks' pace): a freeze
    begun while another held the node, or an outage begun while one lasted, is one incident."""
    began = fault.injected_at or 0.0
    return incident.at - 5 <= began + fault.seconds and began - 5 <= incident.at + incident.seconds


def left_behind(run_id: str, store: RunStore) -> list[str]:
    """No process of the run alive, no owner still holding it."""
    broken = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if run_id in cmd and state != "Z":
            broken.append(f"process {proc.name} of the run still alive: {cmd[:120]}")
    owner, _ = store.owner()
    if owner is not None and owner.kind != "none":
        broken.append(f"the run is still owned: {owner.holder}")
    return broken


def model_accuracy(store: RunStore) -> float | None:
    """The DONE model's accuracy on the held-out digits, in a fresh process (Program mode's export)."""
    with tempfile.TemporaryDirectory() as scratch:
        keys = store.store.list_keys(MODEL + "/saved_model/")
        if not keys:
            return None
        for key in keys:
            store.store.get_file(key, Path(scratch) / key)
        try:
            return fresh_process_accuracy(str(Path(scratch) / MODEL / "saved_model"))
        except AssertionError:
            return -1.0  # a model that does not load is a wrong outcome, said by the caller
