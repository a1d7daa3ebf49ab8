"""How runs look in a terminal: rich tables built from plain dicts (no domain logic here)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from dlinfra.deploy import Outcome, Snapshot


def _num(value: Any, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _mean_sd(stat: dict[str, float] | None, fmt: str = "{:.1f}") -> str:
    if not stat:
        return "-"
    return f"{fmt.format(stat['mean'])} ± {fmt.format(stat['sd'])}"


def nodes_table(nodes: dict[str, dict[str, Any] | None], title: str = "") -> Table:
    table = Table(title=title or None, title_justify="left")
    for column in ("node", "state", "step", "loss", "examples/s", "heartbeat", "restarts"):
        table.add_column(column, justify="left" if column in ("node", "state") else "right")
    now = time.time()
    for name, st in nodes.items():
        if st is None:
            table.add_row(name, "booting", "-", "-", "-", "-", "-")
            continue
        total = st.get("total_steps")
        step = f"{st.get('step', 0)}/{total}" if total else "-"
        table.add_row(
            name,
            st.get("state", "?"),
            step,
            _num(st.get("loss"), "{:.4f}"),
            _num(st.get("examples_per_sec")),
            f"{now - st['heartbeat']:.0f}s ago" if st.get("heartbeat") else "-",
            str(st.get("restarts", 0)),
        )
    return table


def progress_table(run_id: str, snap: Snapshot) -> Table:
    return nodes_table(snap.nodes, title=f"run {run_id} · {snap.elapsed:.0f}s")


def progress_line(snap: Snapshot) -> str:
    """One line for logs and CI, where a live table cannot redraw."""
    up = sum(1 for s in snap.nodes.values() if s is not None)
    trainer = next((s for s in snap.nodes.values() if s and s.get("total_steps")), None)
    step = f"step {trainer.get('step')}/{trainer.get('total_steps')}" if trainer else "starting"
    loss = f" loss {trainer['loss']:.4f}" if trainer and trainer.get("loss") is not None else ""
    return f"[{snap.elapsed:5.0f}s] nodes up {up}/{len(snap.nodes)} · {step}{loss}"


def result_table(outcome: Outcome) -> Table:
    m = outcome.metrics or {}
    table = Table(title=f"run {outcome.run.id}: {outcome.state}", title_justify="left", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right", overflow="fold")
    rows = [
        ("strategy", m.get("strategy", "-")),
        ("workers / ps", f"{m.get('workers', '-')} / {m.get('ps', '-')}"),
        ("steps", _num(m.get("steps"))),
        ("global steps/s", _mean_sd(m.get("global_steps_per_sec"))),
        ("examples/s", _mean_sd(m.get("examples_per_sec"), "{:.0f}")),
        ("training time", _num(m.get("train_seconds"), "{:.1f} s")),
        ("total time", f"{outcome.wall_seconds:.1f} s"),
        ("command to first step", _num(outcome.seconds_to_first_step, "{:.1f} s")),
        ("eval accuracy", _num(m.get("eval_accuracy"), "{:.4f}")),
        ("model", m.get("model_uri", "-")),
    ]
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def print_failure(console: Console, outcome: Outcome) -> None:
    console.print(
        f"[bold red]run {outcome.run.id} {outcome.state}[/]: node {outcome.failed_node}: {outcome.error}"
    )
    if outcome.log_tail:
        console.print(
            f"--- last {len(outcome.log_tail)} lines of {outcome.failed_node}'s log ---", markup=False
        )
        for line in outcome.log_tail:
            console.print(line, markup=False, highlight=False)


def compare_table(rows: list[dict[str, Any]]) -> Table:
    from dlinfra.compare import COLUMNS, cells
    from dlinfra.pricing import PRICE_TABLE_DATE

    table = Table(caption=f"cost: instance-hours x on-demand prices of {PRICE_TABLE_DATE}; local runs cost 0")
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(*cells(r))
    return table
