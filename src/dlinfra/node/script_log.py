"""A script's lines in its node's log, as its agent reads them back: this life's tail, and the line a
user wants first when it failed."""

from __future__ import annotations

import os
from pathlib import Path

TAIL_LINES = 40
RUNNING = "running "  # the agent's line before its script starts: where this life's log begins
TAIL_BYTES = 4000


def log_tail(log_file: Path | None) -> list[str]:
    """This life's last lines of the node's log (the script writes to the same log as its agent;
    an earlier life's lines, before the agent's `running` line, are not this script's)."""
    if log_file is None or not log_file.is_file():
        return []
    with open(log_file, "rb") as fh:
        fh.seek(max(0, fh.seek(0, os.SEEK_END) - 64 * 1024))
        lines = fh.read().decode(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(RUNNING)]
    return lines[starts[-1] + 1 if starts else 0 :][-TAIL_LINES * 4 :]


def last_error(tail: list[str]) -> str:
    """The line a user wants first: the exception a traceback ends with, else the last line."""
    lines = [line.strip() for line in tail if line.strip()]
    for line in reversed(lines):
        if ("Error" in line or "Exception" in line) and ":" in line and not line.startswith("File "):
            return line[:500]
    return lines[-1][:500] if lines else "it printed nothing"


def tail_text(tail: list[str]) -> str:
    return "\n".join(tail[-TAIL_LINES:])[-TAIL_BYTES:]
