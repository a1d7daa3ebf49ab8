"""The preflight table (runs.preflight): in deploy's result, `dlinfra show` and `dlinfra preflight`."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from dlinfra.cli.console import table_box
from dlinfra.runs.layout import RunStore
from dlinfra.runs.preflight import table as preflight_table


def preflight_view(store: RunStore) -> Group | None:
    """The last round's table and its verdict; None for a run without preflight."""
    last = store.preflight_rounds()
    if not last:
        return None
    found, verdict = store.preflight_round(last)
    table = drawn(preflight_table(list(found.values()), verdict), f"preflight, round {last}")
    said = verdict.says() if verdict else "preflight: no verdict yet (a node is still measuring)"
    return Group(table, Text(said))


def drawn(rows: list[list[str]], title: str) -> Table:
    """The node column is never cut (a name to pass to `dlinfra logs --node`): on a narrow screen the
    figures' headers and the flags wrap instead."""
    table = Table(box=table_box(), title=title, title_justify="left")
    nodes = [row[0] for row in rows]
    table.add_column(rows[0][0], no_wrap=True, min_width=max(map(len, nodes)))
    for header in rows[0][1:]:
        table.add_column(header, justify="left" if header == "flag" else "right", overflow="fold")
    for row in rows[1:]:
        table.add_row(*row[:-1], Text(row[-1], style="green" if row[-1] == "ok" else "bold red"))
    return table
