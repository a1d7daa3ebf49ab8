"""Where the CLI writes: results to stdout, progress and problems to stderr."""

from __future__ import annotations

import sys
from typing import Literal

from rich import box
from rich.console import Console

from dlinfra.errors import mask

ColorMode = Literal["auto", "always", "never"]

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def set_color(mode: ColorMode) -> None:
    """auto: colour and box-drawing on a terminal only (rich honours NO_COLOR); always; never.
    The same two objects are set up again: every CLI module holds them, and rich settles colour and
    terminal at construction."""
    terminal = {"auto": None, "always": True, "never": False}[mode]
    for console, stderr in ((out, False), (err, True)):
        console.__init__(  # type: ignore[misc]
            stderr=stderr,
            highlight=False,
            soft_wrap=True,
            force_terminal=terminal,
            no_color=True if mode == "never" else None,
        )


def table_box() -> box.Box:
    """Box-drawing for a terminal; plain ASCII for a pipe, a file or a CI log."""
    return box.HEAVY_HEAD if out.is_terminal else box.ASCII


def error(message: str) -> None:
    # Plain writes: one problem per line, never re-wrapped, greppable in CI logs. Masked here too: an
    # error may quote text from elsewhere (a tool's diagnostics, an exception) that no validator saw.
    sys.stderr.write(f"error: {mask(message)}\n")
