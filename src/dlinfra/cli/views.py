"""How runs look in a terminal and in logs: rich tables and plain lines (no domain logic here)."""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from dlinfra.catalog import InstanceType, catalog
from dlinfra.compare import COLUMNS
from dlinfra.deploy import Outcome, Snapshot


def _num(value: Any, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _mean_sd(stat: Any, fmt: str = "{:.1f}") -> str:
    """A mean ± sd record (or its dict, from JSON)."""
    if not stat:
        return "-"
    mean, sd = (stat["mean"], stat["sd"]) if isinstance(stat, dict) else (stat.mean, stat.sd)
    return f"{fmt.format(mean)} ± {fmt.format(sd)}"


# ---------------------------------------------------------------- nodes and progress


def _devices(names: list[str] | None) -> str:
    """What a node trains on, as TensorFlow saw it: its GPUs, else CPU."""
    if not names:
        return "-"
    return ", ".join(n for n in names if n.startswith("GPU")) or "CPU"


def nodes_table(nodes: dict[str, dict[str, Any] | None], title: str = "") -> Table:
    table = Table(title=title or None, title_justify="left")
    for column in ("node", "state", "step", "loss", "examples/s", "heartbeat", "restarts", "devices"):
        table.add_column(column, justify="left" if column in ("node", "state", "devices") else "right")
    now = time.time()
    for name, st in nodes.items():
        if st is None:
            table.add_row(name, "booting", "-", "-", "-", "-", "-", "-")
            continue
        total = st.get("total_steps")
        step = f"{st.get('step', 0)}/{total}" if total else "-"
        state = st.get("state", "?")
        if st.get("process") in ("stopped", "zombie", "gone") and state not in ("done", "failed", "stopped"):
            state += f" (process {st['process']})"  # what the beacon sees, not what the trainer last said
        table.add_row(
            name,
            state,
            step,
            _num(st.get("loss"), "{:.4f}"),
            _num(st.get("examples_per_sec")),
            f"{now - st['heartbeat']:.0f}s ago" if st.get("heartbeat") else "-",
            str(st.get("restarts", 0)),
            _devices(st.get("devices")),
        )
    return table


def progress_line(snap: Snapshot) -> str:
    """One line for logs and CI, where a live table cannot redraw."""
    up = sum(1 for s in snap.nodes.values() if s is not None)
    trainer = next((s for s in snap.nodes.values() if s and s.total_steps), None)
    step = f"step {trainer.step}/{trainer.total_steps}" if trainer else "starting"
    loss = f" loss {trainer.loss:.4f}" if trainer and trainer.loss is not None else ""
    return f"[{snap.elapsed:5.0f}s] nodes up {up}/{len(snap.nodes)} · {step}{loss}"


class ProgressLines:
    """Logs and CI: a line when progress changes (or every 15 s), never a redraw."""

    def __init__(self, console: Console) -> None:
        self.console, self.last, self.t = console, "", 0.0

    def __call__(self, snap: Snapshot) -> None:
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

    def __call__(self, snap: Snapshot) -> None:
        if self.live is None:
            self.live = Live(console=self.console, refresh_per_second=4)
            self.live.start()
        nodes = {name: st.model_dump() if st else None for name, st in snap.nodes.items()}
        self.live.update(nodes_table(nodes, title=progress_line(snap)))

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


# ---------------------------------------------------------------- results


def result_table(outcome: Outcome) -> Table:
    m = outcome.metrics
    table = Table(title=f"run {outcome.run.id}: {outcome.state}", title_justify="left", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right", overflow="fold")
    rows = [
        ("strategy", m.strategy if m else "-"),
        ("workers / ps", f"{m.workers} / {m.ps}" if m else "- / -"),
        ("replicas · global batch", f"{_num(m.replicas)} · {_num(m.global_batch)}" if m else "-"),
        ("learning rate", f"{m.learning_rate:g}, scaling {m.lr_scaling}" if m and m.learning_rate else "-"),
        ("precision", ("mixed_float16" if m.mixed_precision else "float32") if m else "-"),
        ("steps", _num(m.steps if m else None)),
        ("global steps/s", _mean_sd(m.global_steps_per_sec if m else None)),
        ("examples/s", _mean_sd(m.examples_per_sec if m else None, "{:.0f}")),
        ("training time", _num(m.train_seconds if m else None, "{:.1f} s")),
        ("total time", f"{outcome.wall_seconds:.1f} s"),
        ("command to first step", _num(outcome.seconds_to_first_step, "{:.1f} s")),
        ("eval accuracy", _num(m.eval_accuracy if m else None, "{:.4f}")),
        ("model", m.model_uri if m else "-"),
    ]
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def print_failure(console: Console, outcome: Outcome) -> None:
    console.print(
        f"[bold red]run {outcome.run.id} {outcome.state}[/]: node {outcome.failed_node}: "
        + escape(outcome.error or "")
    )
    if outcome.log_tail:
        console.print(
            f"--- last {len(outcome.log_tail)} lines of {outcome.failed_node}'s log ---", markup=False
        )
        for line in outcome.log_tail:
            console.print(line, markup=False, highlight=False)


def runs_table(rows: list[dict[str, Any]]) -> Table:
    table = Table()
    for column in ("run", "status", "age", "target", "strategy", "accuracy", "resources"):
        table.add_column(column)
    for r in rows:
        acc = "-" if r["eval_accuracy"] is None else f"{r['eval_accuracy']:.4f}"
        up = "-" if not r["resources_up"] else "up" + _num(r["usd_per_hour"], " ${:.2f}/h")
        table.add_row(r["run_id"], r["status"], r["age"], r["target"] or "-", r["strategy"] or "-", acc, up)
    return table


# ---------------------------------------------------------------- the instance catalog


def instances_table(kinds: list[InstanceType], region: str, note: str) -> Table:
    table = Table(
        caption=f"GiB: memory; Gbps: network, peak and baseline; $/h: on-demand, {region}; {note}",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for column in ("type", "vCPU", "GiB", "GPUs", "GPU", "GiB/GPU", "Gbps", "base", "EFA", "$/h"):
        table.add_column(
            column,
            justify="left" if column in ("type", "GPU") else "right",
            no_wrap=True,
            min_width={"$/h": 7, "base": 5}.get(column, len(column)),
        )
    for k in kinds:
        table.add_row(
            k.name,
            str(k.vcpus),
            f"{k.memory_gib:g}",
            str(k.gpus) if k.gpus else "-",
            (k.gpu_model or "-").removeprefix("NVIDIA "),
            _num(k.gpu_memory_gib, "{:g}"),
            f"{k.network_gbps:g}",
            f"{k.network_baseline_gbps:g}",
            "yes" if k.efa else "-",
            _num(k.price(region), "{:.4f}"),
        )
    return table


# ---------------------------------------------------------------- compare


def compare_cells(r: dict[str, Any]) -> list[str]:
    """One run as the table's text cells, in COLUMNS order."""
    return [
        r["run"],
        str(r["status"]),
        r["target"],
        r["roles"],
        r["strategy"],
        _mean_sd(r["global_steps_per_sec"], "{:.1f}"),
        _mean_sd(r["examples_per_sec"], "{:.0f}"),
        _num(r["train_seconds"], "{:.1f}"),
        _num(r["wall_seconds"], "{:.0f}"),
        _num(r["eval_accuracy"], "{:.4f}"),
        _num(r["cost_usd"], "{:.4f}"),
    ]


def compare_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        caption=f"cost: instance-hours x on-demand prices of {catalog().prices_as_of}, NAT gateway included; "
        "local runs cost 0"
    )
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(*compare_cells(r))
    return table


def compare_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(compare_cells(r)) + " |" for r in rows]
    lines.append(
        f"\nCost: instance-hours x on-demand prices of {catalog().prices_as_of}, NAT gateway included "
        "(`dlinfra instances`; src/dlinfra/instance_types.json)."
    )
    return "\n".join(lines) + "\n"
