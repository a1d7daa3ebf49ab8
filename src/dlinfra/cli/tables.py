"""Tables of many rows that must fit a terminal: `dlinfra runs`, the instance catalog, and the cell
and width helpers the other views share (a narrow screen drops columns, never cuts a run id)."""

from __future__ import annotations

import textwrap
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from dlinfra.cli.console import out, table_box
from dlinfra.runs.cells import num as _num
from dlinfra.spec.catalog import InstanceType

# Columns a narrow screen drops first; the run id, the one thing a user copies, is never cut.
RUNS_COLUMNS = (
    "run", "status", "age", "target", "strategy", "accuracy", "restarts", "cost", "resources", "owner"
)  # fmt: skip
_RUNS_DROPPED_FIRST = (
    "owner", "resources", "strategy", "restarts", "cost", "target", "age", "accuracy", "status"
)  # fmt: skip


def _width(columns: list[list[str]]) -> int:
    """The width of a table whose cells never wrap: each column as wide as its widest line, a space
    of padding either side, a border between columns and at both edges."""
    widest = [
        max(cell_len(line) for cell in column for line in cell.splitlines() or [""]) for column in columns
    ]
    return sum(w + 2 for w in widest) + len(widest) + 1


STATUS_STYLE = {"DONE": "green", "FAILED": "red", "STOPPED": "yellow", "RUNNING": "cyan"}


def _table(headers: list[str], rows: list[list[str]], caption: str | None = None) -> Table:
    table = Table(box=table_box(), caption=caption, caption_justify="left")
    for i, header in enumerate(headers):
        # a run id is what a user copies: rich squeezes a column only down to its min_width
        whole = max(cell_len(r[i]) for r in [headers, *rows]) if header == "run" else None
        table.add_column(header, no_wrap=True, min_width=whole)
    status = headers.index("status") if "status" in headers else None
    for r in rows:
        cells: list[str | Text] = list(r)
        if status is not None:
            state = r[status].split(" ")[0]  # a note may follow it: "DONE · no model"
            cells[status] = Text(r[status], style=STATUS_STYLE.get(state, ""))
        table.add_row(*cells)
    return table


def _run_cells(r: dict[str, Any]) -> dict[str, str]:
    """One row of `dlinfra runs`, column → text."""
    acc = "-" if r["eval_accuracy"] is None else f"{r['eval_accuracy']:.4f}"
    up = "-" if not r["resources_up"] else "up" + _num(r["usd_per_hour"], " ${:.2f}/h")
    owner = r.get("owner") or "-"  # who heals and tears it down (runs.ownership)
    cost = _num(r.get("usd_spent"), "${:.2f}")  # at the plan's prices since the nodes started
    texts = (
        r["run_id"],
        r["status"] + (f" · {r['note']}" if r.get("note") else ""),
        r["age"],
        r["target"] or "-",
        r["strategy"] or "-",
        acc,
        _num(r.get("restarts")),  # every node's, as the run ended (-: a run from before they were kept)
        cost,
        up,
        owner,
    )
    return dict(zip(RUNS_COLUMNS, texts, strict=True))


def _fitting(
    columns: tuple[str, ...], dropped_first: tuple[str, ...], cells: list[dict[str, str]], width: int
) -> list[str]:
    """The columns that fit `width` uncut, dropping `dropped_first` in order until they do."""
    shown = list(columns)
    for column in dropped_first:
        if _width([[c, *(row[c] for row in cells)] for c in shown]) <= width:
            break
        shown.remove(column)
    return shown


def _dropped_caption(dropped: list[str], width: int, full_view: str) -> str | None:
    """What a narrow screen left out, wrapped by hand: our consoles soft-wrap, so rich never would."""
    if not dropped:
        return None
    # the command is one word to the wrapper: a user copies it, so it is never cut across lines
    whole = full_view.replace(" ", "\0")
    note = f"not shown at {width} columns: {', '.join(dropped)} (`{whole}` has all)"
    return "\n".join(textwrap.wrap(note, width, break_on_hyphens=False)).replace("\0", " ")


def runs_table(rows: list[dict[str, Any]], width: int) -> Table:
    cells = [_run_cells(r) for r in rows]
    shown = _fitting(RUNS_COLUMNS, _RUNS_DROPPED_FIRST, cells, width)
    dropped = [c for c in RUNS_COLUMNS if c not in shown]
    caption = _dropped_caption(dropped, width, "dlinfra runs --json")
    return _table(shown, [[row[c] for c in shown] for row in cells], caption)


# ---------------------------------------------------------------- the instance catalog


def instances_table(kinds: list[InstanceType], region: str, note: str) -> Table:
    table = Table(
        caption=f"GiB: memory; Gbps: network, peak and baseline; NVMe: instance store, GB; $/h: on-demand, "
        f"{region}; {note}",
        caption_justify="left",
        box=box.SIMPLE_HEAD if out.is_terminal else box.ASCII2,
        pad_edge=False,
    )
    widest_type = max((len(k.name) for k in kinds), default=len("type"))
    for column in ("type", "vCPU", "GiB", "GPUs", "GPU", "GiB/GPU", "Gbps", "base", "EFA", "NVMe", "$/h"):
        table.add_column(
            column,
            justify="left" if column in ("type", "GPU") else "right",
            no_wrap=True,
            # the type, what a spec names, stays whole: rich squeezes a column only down to its min_width
            min_width={"$/h": 7, "base": 5, "type": widest_type}.get(column, len(column)),
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
            str(k.instance_store_gb) if k.instance_store_gb else "-",
            _num(k.price(region), "{:.4f}"),
        )
    return table
