"""A script's lines in its node's log, as its agent reads them back: this life's tail, and the line a
user wants first when it failed."""

from __future__ import annotations

import os
import re
from pathlib import Path

TAIL_LINES = 40
RUNNING = "running "  # the agent's line before its script starts: where this life's log begins
TAIL_BYTES = 4000
TAIL_READ = 256 * 1024
TRACEBACK = "Traceback (most recent call last):"
TENSORFLOW_LOG = re.compile(r"[IWEF]\d{4} ")  # TensorFlow's own log lines (I0000 00:00:…), at exit too
MESSAGE_LINES, MESSAGE_CHARS = 20, 2000  # of a failure's message, in the status and the marker


def log_tail(log_file: Path | None) -> list[str]:
    """This life's last lines of the node's log (the script writes to the same log as its agent;
    an earlier life's lines, before the agent's `running` line, are not this script's)."""
    if log_file is None or not log_file.is_file():
        return []
    with open(log_file, "rb") as fh:
        # far enough back for the traceback: TensorFlow logs on at exit (seen: 159 lines, 45 KB, of
        # `E0000 … context.cc` after a coordinator's UnavailableError)
        fh.seek(max(0, fh.seek(0, os.SEEK_END) - TAIL_READ))
        lines = fh.read().decode(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(RUNNING)]
    return lines[starts[-1] + 1 if starts else 0 :]


def last_error(tail: list[str]) -> str:
    """What a user wants first: the exception a traceback ends with, its whole message (which may run
    over lines: TensorFlow's do), capped; else the last line that names an error, else the last line."""
    lines = [line.rstrip() for line in tail]
    starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK)]
    if starts:
        after = lines[starts[-1] + 1 :]
        # the frames are indented; the exception's first line is not, and its message runs to the end
        first = next((i for i, line in enumerate(after) if line and not line[0].isspace()), None)
        if first is not None:
            return _capped([line for line in after[first:] if not TENSORFLOW_LOG.match(line)])
    lines = [line.strip() for line in tail if line.strip()]
    for line in reversed(lines):
        if ("Error" in line or "Exception" in line) and ":" in line and not line.startswith("File "):
            return line[:500]
    return lines[-1][:500] if lines else "it printed nothing"


def _capped(lines: list[str]) -> str:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    if len(lines) > MESSAGE_LINES:
        lines = [*lines[:MESSAGE_LINES], f"… ({len(lines) - MESSAGE_LINES} more lines in the node's log)"]
    text = "\n".join(lines)
    return (
        text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " … (cut: the node's log has it all)"
    )


def tail_text(tail: list[str]) -> str:
    return "\n".join(tail[-TAIL_LINES:])[-TAIL_BYTES:]
