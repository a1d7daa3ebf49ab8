"""How runs look in a terminal and in logs: rich tables and plain lines (no domain logic here)."""

from __future__ import annotations

import shlex
import time
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dlinfra.cli.console import table_box
from dlinfra.cli.tables import _dropped_caption, _fitting, _num
from dlinfra.runs import restarts
from dlinfra.runs.records import NO_MODEL_SAVED
from dlinfra.runs.results import input_bound, restart_lines, result_rows
from dlinfra.watching import Outcome, Snapshot

# ---------------------------------------------------------------- nodes and progress


def _devices(names: list[str] | None) -> str:
    """What a node trains on, as TensorFlow saw it: its GPUs, else CPU."""
    if not names:
        return "-"
    return ", ".join(n for n in names if n.startswith("GPU")) or "CPU"


# `status` and the live table: a node's name, state and step are never cut; on a narrow screen the
# other columns give way, least useful first, and the caption says which.
NODE_COLUMNS = ("node", "state", "step", "loss", "examples/s", "heartbeat", "restarts", "devices")
_NODES_KEPT = ("node", "state", "step")
_NODES_DROPPED_FIRST = ("devices", "examples/s", "loss", "restarts", "heartbeat")


def _node_cells(name: str, st: dict[str, Any] | None, now: float) -> dict[str, str]:
    """One row of the nodes table, column → text."""
    if st is None:
        return dict(zip(NODE_COLUMNS, (name, "booting", *("-",) * 6), strict=True))
    total = st.get("total_steps")
    step = f"{st.get('step', 0)}/{total}" if total else (str(st["step"]) if st.get("step") else "-")
    state = unreported(st) or st.get("state", "?")
    if st.get("process") in ("stopped", "zombie", "gone") and state not in ("done", "failed", "stopped"):
        state += f" (process {st['process']})"  # what the beacon sees, not what the trainer last said
    if st.get("notice"):  # EC2's word about the machine: a rebalance or a coming interruption
        state += f" · {st['notice']}"
    texts = (
        name,
        state,
        step,
        _num(st.get("loss"), "{:.4f}"),
        _num(st.get("examples_per_sec")),
        f"{now - st['heartbeat']:.0f}s ago" if st.get("heartbeat") else "-",
        str(st.get("restarts", 0)),
        _devices(st.get("devices")),
    )
    return dict(zip(NODE_COLUMNS, texts, strict=True))


def nodes_table(nodes: dict[str, dict[str, Any] | None], width: int, title: str = "") -> Table:
    now = time.time()
    cells = [_node_cells(name, st, now) for name, st in nodes.items()]
    shown = _fitting(NODE_COLUMNS, _NODES_DROPPED_FIRST, cells, width)
    dropped = [c for c in NODE_COLUMNS if c not in shown]
    table = Table(
        title=title or None,
        title_justify="left",
        caption=_dropped_caption(dropped, width, "dlinfra status --json"),
        caption_justify="left",
        box=table_box(),
    )
    for column in shown:
        kept = column in _NODES_KEPT
        # rich shrinks even a no_wrap column of a table too wide for the screen, but never below its
        # min_width: the kept columns stay whole (the lines run long) when nothing else is left to drop
        widest = max(cell_len(text) for text in [column, *(row[column] for row in cells)])
        table.add_column(
            column,
            justify="left" if column in ("node", "state", "devices") else "right",
            no_wrap=kept,
            min_width=widest if kept else None,
        )
    for row in cells:
        table.add_row(*(row[c] for c in shown))
    return table


def unreported(st: dict[str, Any]) -> str | None:
    """A script running without reports (dlinfra.report or TensorBoard scalars): say so, and how busy
    it is, rather than a step it never gives."""
    if st.get("state") != "running" or st.get("step"):
        return None
    cpu = st.get("cpu_percent")
    return "running · no progress reported" + (f" · CPU {cpu:.0f}%" if cpu is not None else "")


def progress_line(snap: Snapshot) -> str:
    """One line for logs and CI, where a live table cannot redraw."""
    up = sum(1 for s in snap.nodes.values() if s is not None)
    trainer = next((s for s in snap.nodes.values() if s and (s.total_steps or s.step)), None)
    checking = [s.state for s in snap.nodes.values() if s and s.state.startswith("preflight")]
    silent = [text for s in snap.nodes.values() if s and (text := unreported(s.model_dump()))]
    if trainer is None or (checking and not trainer.step):  # the chief's round, or the last node's
        step = checking[0] if checking else (silent[0] if silent else "starting")
    else:  # a script reports steps without a total (or nothing: then its nodes' states say it runs)
        step = f"step {trainer.step}" + (f"/{trainer.total_steps}" if trainer.total_steps else "")
    loss = f" loss {trainer.loss:.4f}" if trainer and trainer.loss is not None else ""
    slow = "".join(f" · straggler {s.node} {s.ratio:.1f}x" for s in snap.stragglers.values())
    return f"[{snap.elapsed:5.0f}s] nodes up {up}/{len(snap.nodes)} · {step}{loss}{slow}"


class ProgressLines:
    """Logs and CI: a line when progress changes (or every 15 s), never a redraw."""

    def __init__(self, console: Console) -> None:
        self.console, self.last, self.t = console, "", 0.0
        self.restarts = restarts.News()

    def __call__(self, snap: Snapshot) -> None:
        for said in self.restarts(snap.nodes.values()):
            self.console.print(said, markup=False, highlight=False)
        line = progress_line(snap)
        core = line.split("]", 1)[1]
        if core != self.last or time.time() - self.t > 15:
            self.console.print(line, markup=False)
            self.last, self.t = core, time.time()

    def close(self) -> None:
        pass


class LiveTable:
    """A terminal: one live table of nodes (state, step/total, loss, examples/s, heartbeat)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self.restarts = restarts.News()

    def __call__(self, snap: Snapshot) -> None:
        if self.live is None:
            self.live = Live(console=self.console, refresh_per_second=4)
            self.live.start()
        for said in self.restarts(snap.nodes.values()):  # above the live table, kept as it redraws
            self.live.console.print(said, markup=False, highlight=False)
        nodes = {name: st.model_dump() if st else None for name, st in snap.nodes.items()}
        self.live.update(nodes_table(nodes, self.console.width, title=progress_line(snap)))

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


# ---------------------------------------------------------------- results


def result_table(outcome: Outcome) -> Table:
    table = Table(
        title=f"run {outcome.run.id}: {outcome.state}",
        title_justify="left",
        show_header=False,
        box=table_box(),
    )
    table.add_column("metric")
    table.add_column("value", justify="right", overflow="fold")
    for key, value in result_rows(outcome):
        table.add_row(key, value)
    return table


def result_view(outcome: Outcome) -> Group:
    """The result table, then the model's URI (and a script's command) on lines of their own: what a
    user copies, which a table cell would wrap or cut to fit the screen."""
    m = outcome.metrics
    model = "-" if m is None else m.model_uri
    if m is not None and m.no_model:  # a script that saved none: what it left instead, and where
        model = f"none: {NO_MODEL_SAVED} ({m.no_model}); {m.left_instead()}"
    lines = [Text(f"model: {model}"), *map(Text, outcome.metrics.outputs_refused if outcome.metrics else [])]
    if outcome.metrics is not None and (advice := input_bound(outcome.metrics.input_wait)):
        lines.append(Text(advice))
    manifest = outcome.run.manifest()
    if manifest.version_changes:  # a rerun is warned, not refused: its nodes have run by now
        changed = "; ".join(manifest.version_changes)
        lines.append(
            Text(f"warning: this rerun's nodes ran other versions than {manifest.rerun_of}'s: {changed}")
        )
    if outcome.metrics is not None and outcome.metrics.command:  # a script run: its command, whole
        lines.insert(0, Text(f"command: {shlex.join(outcome.metrics.command)}"))
    return Group(result_table(outcome), *map(Text, restart_lines(outcome)), *lines)


def print_failure(console: Console, outcome: Outcome) -> None:
    console.print(
        f"[bold red]run {outcome.run.id} {outcome.state}[/]: node {outcome.failed_node}: "
        + escape(outcome.error or "")
    )
    for line in restart_lines(outcome):
        console.print(line, markup=False, highlight=False)
    if outcome.log_tail:
        console.print(
            f"--- last {len(outcome.log_tail)} lines of {outcome.failed_node}'s log ---", markup=False
        )
        for line in outcome.log_tail:
            console.print(line, markup=False, highlight=False)
