"""`dlinfra compare`: runs side by side, as a table that fits the screen or as Markdown."""

from __future__ import annotations

import textwrap
from typing import Any

from rich.cells import cell_len
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from dlinfra.cli.tables import _table, _width
from dlinfra.runs.compare import COLUMNS
from dlinfra.runs.compare import cells as compare_cells
from dlinfra.spec.catalog import catalog


def compare_view(rows: list[dict[str, Any]], width: int) -> list[RenderableType]:
    """Runs as rows when that fits the screen; else the runs as columns under short labels (a metric
    a row, as many runs a table as fit), with a legend of the whole ids. No cell is ever cut."""
    # wrapped here: the console prints it soft-wrapped, and a pipe at 80 columns must get 80
    note = Text(
        textwrap.fill(
            f"cost $: instance-hours x on-demand prices of {catalog().prices_as_of} (spot hours x the "
            "spec's dated cluster.workers.spot.price_per_hour), NAT gateway included; local runs cost 0",
            width=width,
        )
    )
    cells = [compare_cells(r) for r in rows]
    as_rows = _width([[c, *(row[i] for row in cells)] for i, c in enumerate(COLUMNS)]) <= width
    notes = _notes(rows, "run" if as_rows else "label")  # a run as the table names it
    if as_rows:
        return [_table(list(COLUMNS), cells), *notes, note]
    metrics = list(COLUMNS[1:])
    per_run = [[r["label"], *cell[1:]] for r, cell in zip(rows, cells, strict=True)]
    for run in per_run:
        run[COLUMNS.index("roles")] = run[COLUMNS.index("roles")].replace(", ", "\n")
    parts: list[RenderableType] = []
    group: list[list[str]] = []
    for run in per_run:
        if group and _width([["", *metrics], *group, run]) > width:
            parts.append(_transposed(metrics, group))
            group = []
        group.append(run)
    parts.append(_transposed(metrics, group))
    legend = [f"{r['label']} = {r['run']}" for r in rows if r["label"] != r["run"]]
    legend = [line if cell_len(line) <= width else line.replace(" = ", " =\n    ") for line in legend]
    return [*parts, *(Text(line) for line in legend), *notes, note]


def _notes(rows: list[dict[str, Any]], name: str) -> list[Text]:
    """Per run, under the table: the packages it runs apart from the first run's, and what it measured."""
    packages = [
        Text(f"packages, {r[name]} against {rows[0][name]}: {', '.join(r['packages_vs_first'])}")
        for r in rows[1:]
        if r["packages_vs_first"]
    ]
    return packages + [
        Text(f"{r[name]} measured: " + ", ".join(f"{k} {v:.6g}" for k, v in sorted(r["scalars"].items())))
        for r in rows
        if r.get("scalars")
    ]


def _transposed(metrics: list[str], runs: list[list[str]]) -> Table:
    return _table(
        ["", *(run[0] for run in runs)], [[m, *(run[1 + i] for run in runs)] for i, m in enumerate(metrics)]
    )


def compare_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(compare_cells(r)) + " |" for r in rows]
    lines.append(
        f"\nCost: instance-hours x on-demand prices of {catalog().prices_as_of} (spot hours x the spec's "
        "dated cluster.workers.spot.price_per_hour), NAT gateway included "
        "(`dlinfra instances`; src/dlinfra/spec/instance_types.json)."
    )
    return "\n".join(lines) + "\n"
