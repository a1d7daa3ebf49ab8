"""Where the CLI writes: results to stdout, progress and problems to stderr."""

from __future__ import annotations

import sys

from rich.console import Console

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def error(message: str) -> None:
    # Plain writes: one problem per line, never re-wrapped, greppable in CI logs.
    sys.stderr.write(f"error: {message}\n")
