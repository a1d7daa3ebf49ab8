"""When a command began: its process's start, not the line of the command's function. Startup's
figures ("command to first step") then count the interpreter and the CLI's own imports (0.3 s
here), which the user waits for as much as for anything after them."""

from __future__ import annotations

import os
import time
from pathlib import Path


def command_started() -> float:
    """Epoch seconds this process started: from /proc on Linux (10 ms ticks since boot), else now."""
    try:
        # after the command name's closing parenthesis: field 3 (state) onward; starttime is field 22
        fields = Path("/proc/self/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc, or no CLOCK_BOOTTIME
        return time.time()
