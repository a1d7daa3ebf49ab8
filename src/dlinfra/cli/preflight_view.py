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
    rows = preflight_table(list(found.values()), verdict)
    table = Table(box=table_box(), title=f"preflight, round {store.preflight_rounds()}", title_justify="left")
    for i, header in enumerate(rows[0]):
        table.add_column(header, justify="left" if i == 0 or header == "flag" else "right", no_wrap=True)
    for row in rows[1:]:
        table.add_row(*row[:-1], Text(row[-1], style="green" if row[-1] == "ok" else "bold red"))
    said = verdict.says() if verdict else "preflight: no verdict yet (a node is still measuring)"
    return Group(table, Text(said))
